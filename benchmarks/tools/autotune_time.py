#!/usr/bin/env python3
"""How much of each variant's cold compile a dit.py log spent in kopt's first-call autotuning.

    python benchmarks/tools/autotune_time.py benchmarks/results/log-dit-s33k.txt

kopt's autotuner logs one line per kernel shape it tunes (``kopt: autotune: NAME [key]: N configs in
X s``); a variant's cold compile is its forward's ``compile X s``. Summing the lines between a
variant's first log line and its forward's result says how much of that compile a shipped or cached
choice (``kopt/kernels/tuned/``, ``~/.cache/kopt/autotune.json``) would have saved. One JSON line per
variant that tuned something.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

_START = re.compile(r"\] (\S+) (\S+): (?!median)")
_TUNED = re.compile(r"kopt: autotune: (\S+) \[.*\]: \d+ configs in ([\d.]+) s")
_FORWARD = re.compile(r"\] +(\S+) (\S+) forward: median [\d.]+ ms, compile ([\d.]+) s")


def autotune_per_variant(text: str) -> list[dict]:
    """Per variant: its cold compile, the seconds and shapes its first call tuned, and the rest."""
    rows, current, tuned = [], None, []
    for line in text.splitlines():
        if (forward := _FORWARD.search(line)) and current == forward.group(1, 2):
            if tuned:
                compile_s, spent = float(forward.group(3)), sum(s for _, s in tuned)
                rows.append(dict(model=current[0], variant=current[1], compile_s=compile_s,
                                 autotune_s=round(spent, 2), shapes=len(tuned),
                                 without_autotune_s=round(compile_s - spent, 2),
                                 largest=max(tuned, key=lambda t: t[1])))
            current, tuned = None, []
        elif (tune := _TUNED.search(line)) and current is not None:
            tuned.append((tune.group(1), float(tune.group(2))))
        elif (start := _START.search(line)) and " forward" not in line and " cfg-pair" not in line:
            current, tuned = start.group(1, 2), []
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path)
    for log in parser.parse_args(argv).logs:
        for row in autotune_per_variant(log.read_text()):
            print(json.dumps({"log": log.name, **row}))


if __name__ == "__main__":
    main()
