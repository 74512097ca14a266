#!/usr/bin/env python3
"""SM clock and board power during each measured row of a dit.py run.

    python benchmarks/tools/clocks.py benchmarks/results/smi-s7d.csv benchmarks/results/log-qwen-image-s7d.txt --gpu 0

``smi.csv`` is what ``run_on_gpus.sh`` records beside the logs (``nvidia-smi
--query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 500``).
A log without timestamps (``--query-gpu=index,clocks.sm,power.draw``, as some device calls logged
it) gives only the busy-sample summary: ``python benchmarks/tools/clocks.py SMI --gpu 1``.
A row's window runs from the log line before its result line to the result line itself. For the
first row of a variant that window also holds its compilation (the GPU idles at ~120 W): read the
CFG-pair and memo-hit rows, which are timed right after the line before them. Why it matters: H200s at
their 700 W limit lower the SM clock, so two rows of one run can run the same kernels at different
clocks; a difference between rows smaller than their clock difference is not a code effect.
"""

from __future__ import annotations

import argparse
import datetime
import re
import statistics
import sys
from pathlib import Path

_LOG_LINE = re.compile(r"^\[(\d\d:\d\d:\d\d) \+\s*[\d.]+s\]\s+(.*)$")
_ROW = re.compile(r"^(\S+) (\S+) (forward|cfg-pair|forward-memo-hit): median ([\d.]+) ms")


def read_smi(path: Path, gpu: int) -> list[tuple[datetime.datetime | None, int, float]]:
    """(time or None when the log has no timestamps, SM clock MHz, power W) samples of one GPU."""
    samples = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        timed = len(parts) >= 4 and "/" in parts[0]
        if not timed:
            parts = ["", *parts]
        if len(parts) < 4 or not parts[2].endswith("MHz") or int(parts[1]) != gpu:
            continue
        when = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f") if timed else None
        samples.append((when, int(parts[2].split()[0]), float(parts[3].split()[0])))
    return samples


def row_windows(log: Path, day: datetime.date) -> list[tuple[str, float, datetime.datetime, datetime.datetime]]:
    """(row label, median ms, start, end) for every measured row in a dit.py log."""
    stamps, windows = [], []
    for line in log.read_text().splitlines():
        found = _LOG_LINE.match(line)
        if not found:
            continue
        when = datetime.datetime.combine(day, datetime.time.fromisoformat(found.group(1)))
        row = _ROW.match(found.group(2))
        if row and stamps:
            windows.append((f"{row.group(2)} {row.group(3)}", float(row.group(4)), stamps[-1], when))
        stamps.append(when)
    return windows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("smi", type=Path)
    parser.add_argument("log", type=Path, nargs="?", help="the dit.py log (rows need a timestamped smi log)")
    parser.add_argument("--gpu", type=int, default=0, help="nvidia-smi index of the card the log's process used")
    parser.add_argument("--busy-watts", type=float, default=300.0, help="samples above this count as busy")
    args = parser.parse_args(argv)
    samples = read_smi(args.smi, args.gpu)
    if not samples:
        print(f"no samples for GPU {args.gpu} in {args.smi}", file=sys.stderr)
        return 1
    timed = samples[0][0] is not None
    rows = row_windows(args.log, samples[0][0].date()) if timed and args.log else []
    if rows:
        print("| row | median ms | samples | SM clock median (min) MHz | power median (max) W |")
        print("|---|---:|---:|---:|---:|")
    for label, median_ms, start, end in rows:
        inside = [(c, w) for t, c, w in samples if start <= t <= end]
        if not inside:
            print(f"| {label} | {median_ms:.2f} | 0 | – | – |")
            continue
        clocks, watts = [c for c, _ in inside], [w for _, w in inside]
        print(f"| {label} | {median_ms:.2f} | {len(inside)} | {statistics.median(clocks):.0f} ({min(clocks)}) "
              f"| {statistics.median(watts):.0f} ({max(watts):.0f}) |")
    busy = sorted(c for _, c, w in samples if w > args.busy_watts)
    if busy:
        watts = sorted(w for _, _, w in samples if w > args.busy_watts)
        decile = len(busy) // 10
        print(f"\nbusy samples (> {args.busy_watts:.0f} W): {len(busy)}; SM clock p10/p50/p90 "
              f"{busy[decile]}/{busy[len(busy) // 2]}/{busy[-1 - decile]} MHz; power p50/max "
              f"{watts[len(watts) // 2]:.0f}/{watts[-1]:.0f} W")
    return 0


if __name__ == "__main__":
    sys.exit(main())
