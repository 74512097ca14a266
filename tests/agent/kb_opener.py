"""A separate process opening new knowledge bases: ``python kb_opener.py FOLDER START ROUNDS``.

Round k opens the new file ``FOLDER/kb-k.sqlite`` at wall-clock time ``START + k / 4`` (a busy wait,
so that two workers given the same START open each file at the same moment). Prints one line per
round; a failure ends the process with its traceback."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from kopt.agent.kb import KnowledgeBase


def main() -> None:
    folder, start, rounds = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    for k in range(rounds):
        while time.time() < start + k / 4:
            pass
        with KnowledgeBase(folder / f"kb-{k}.sqlite") as kb:
            print(k, kb.schema_version, flush=True)


if __name__ == "__main__":
    main()
