#!/usr/bin/env python3
"""Kernel by kernel through one transformer block of a profiled forward (a ``dit.py --trace`` file).

    python benchmarks/tools/trace_blocks.py benchmarks/results/trace-ltx-video-kopt-regional-forward-s16b.json.gz \\
        [--block 5] [--top 12]

A block is the span from one call of the forward's longest attention kernel to the next (the same
kernel runs once per block at that length). Prints that span's kernels in order with their durations, then every
kernel outside GEMM and attention (``benchmarks.dit.breakdown.classify``) summed by name over the
whole forward: the time a rewrite can reach, and where two variants' traces differ kernel for kernel.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    import sys

    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.dit.breakdown import classify  # noqa: E402

LIBRARY = ("gemm", "attention")


def kernels(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace's GPU kernels in start order."""
    return sorted((e for e in trace["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])


def block(events: Sequence[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """The kernels from the ``index``-th call of the longest attention kernel up to the next call."""
    attention = [e for e in events if classify(e["name"]) == "attention"]
    if not attention:
        raise SystemExit("no attention kernel in this trace")
    longest = max(attention, key=lambda e: e["dur"])
    # the same kernel may also serve a shorter attention (cross-attention to the text): calls of at
    # least half the longest one's duration mark the blocks
    starts = [i for i, e in enumerate(events) if e["name"] == longest["name"] and e["dur"] >= longest["dur"] / 2]
    if index + 1 >= len(starts):
        raise SystemExit(f"the trace has {len(starts)} calls of {longest['name'][:60]}; "
                         f"choose --block below {len(starts) - 1}")
    return list(events[starts[index]:starts[index + 1]])


def outside_libraries(events: Sequence[dict[str, Any]]) -> list[tuple[str, int, float]]:
    """(name, calls, µs) of every kernel outside GEMM and attention, longest total first."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in events:
        if classify(e["name"]) not in LIBRARY:
            totals[e["name"]][0] += 1
            totals[e["name"]][1] += e["dur"]
    return sorted(((n, int(c), t) for n, (c, t) in totals.items()), key=lambda item: -item[2])


def report(trace: dict[str, Any], index: int, top: int) -> str:
    events = kernels(trace)
    span = block(events, index)
    lines = [f"block {index}: {len(span)} kernels, {sum(e['dur'] for e in span):.1f} µs", ""]
    lines += [f"{e['dur']:9.1f} µs  {classify(e['name']):<16} {e['name'][:90]}" for e in span]
    rest = outside_libraries(events)
    lines += ["", f"outside GEMM and attention, whole forward: {sum(t for _, _, t in rest) / 1e3:.2f} ms "
              f"in {sum(c for _, c, _ in rest)} kernels"]
    lines += [f"{t / 1e3:8.3f} ms {c:5d}x  {t / c:7.1f} µs each  {n[:90]}" for n, c, t in rest[:top]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="a gzipped Chrome trace written by dit.py --trace")
    parser.add_argument("--block", type=int, default=5, help="which block to list (from 0)")
    parser.add_argument("--top", type=int, default=12, help="kernels outside the libraries to list")
    args = parser.parse_args(argv)
    with gzip.open(args.trace, "rt") as handle:
        print(report(json.load(handle), args.block, args.top))


if __name__ == "__main__":
    main()
