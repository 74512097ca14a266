"""A separate process writing to one knowledge base: ``python kb_writer.py PATH WORKER COUNT WORKERS``.

Prints one line per write, ``start end`` (monotonic-clock seconds), so the test can show that the
two processes' writes really interleaved."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from kopt.agent.kb import KnowledgeBase, Outcome, Status
from tests.agent.kb_helpers import GPU_ENV, candidate_for, scaled_gelu_region


def main() -> None:
    path, worker, count, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    region = scaled_gelu_region()
    with KnowledgeBase(path) as kb:
        kb.record_region(region, model=f"worker{worker}")
        folder = Path(path).parent
        (folder / f"ready-{worker}").touch()
        waited = time.monotonic() + 120
        while len(list(folder.glob("ready-*"))) < workers:  # every worker starts writing at the same moment
            if time.monotonic() > waited:
                raise SystemExit("the other writer never became ready (it failed: see its stderr)")
            time.sleep(0.001)
        for index in range(count):
            start = time.monotonic()
            record = kb.record_candidate(candidate_for(region, worker * 100000 + index), status=Status.REJECTED,
                                         reason=f"worker {worker} #{index}", environment=GPU_ENV)
            if index % 10 == 0:
                kb.record_lesson(region.class_key, Outcome.FAILED, f"worker {worker} lesson {index}",
                                 evidence=[record])
            print(f"{start} {time.monotonic()}", flush=True)
            time.sleep(0.002)  # a little room for the other writer to take the lock in between


if __name__ == "__main__":
    main()
