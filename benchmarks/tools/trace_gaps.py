#!/usr/bin/env python3
"""Where a profiled forward leaves the GPU idle: the gaps between kernels and what the host did meanwhile.

    python benchmarks/tools/trace_gaps.py benchmarks/results/trace-flux1-kopt-forward.json.gz [--min-us 20]

Reads a Chrome trace written by ``benchmarks/dit/dit.py --trace`` (or ``pipeline.py --trace``).
Prints the host time before the first kernel, then every GPU idle gap of at least ``--min-us``
(all streams together) with the outermost host operations that overlap it, and a total per host
operation name: the launch overhead, synchronisations and Python work that a CUDA graph or a
reordering would remove. Valid as attribution, not timing: the profiler adds its own cost per event.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cpu_op", "user_annotation", "cuda_runtime", "python_function")


def load(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        return json.load(handle)["traceEvents"]


def _outermost(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Host events not nested inside another host event of the same thread."""
    ordered = sorted(events, key=lambda e: (e["tid"], e["ts"], -e.get("dur", 0)))
    outer, end_by_thread = [], {}
    for event in ordered:
        end = event["ts"] + event.get("dur", 0)
        if event["ts"] >= end_by_thread.get(event["tid"], -1.0):
            outer.append(event)
            end_by_thread[event["tid"]] = end
    return outer


def gaps(events: list[dict[str, Any]], min_us: float) -> dict[str, Any]:
    """The idle gaps of the first marked forward and the host operations overlapping each."""
    mark = next((e for e in events if e.get("cat") == "user_annotation"), None)
    if mark is None:
        raise SystemExit("no marked forward in this trace (written by benchmarks/dit/breakdown.py?)")
    start, stop = mark["ts"], mark["ts"] + mark["dur"]
    device = sorted((e for e in events if e.get("cat") in DEVICE_CATEGORIES and start <= e["ts"] <= stop),
                    key=lambda e: e["ts"])
    host = [e for e in events if e.get("cat") in ("cpu_op", "cuda_runtime") and start <= e["ts"] <= stop]
    host = _outermost(host)
    found, end = [], device[0]["ts"] if device else stop
    for event in device:
        if event["ts"] - end >= min_us:
            overlapping = [h for h in host if h["ts"] < event["ts"] and h["ts"] + h.get("dur", 0) > end]
            found.append({"start_us": end - start, "idle_us": event["ts"] - end, "next_kernel": event["name"][:80],
                          "host": [(h["name"][:60], round(h.get("dur", 0), 1)) for h in overlapping][:8]})
        end = max(end, event["ts"] + event.get("dur", 0))
    per_host: dict[str, float] = defaultdict(float)
    for gap in found:
        for name, _duration in gap["host"]:
            per_host[name] += gap["idle_us"] / max(1, len(gap["host"]))
    return {"host_before_first_kernel_us": (device[0]["ts"] - start) if device else None,
            "gaps": found, "idle_us": sum(g["idle_us"] for g in found),
            "idle_by_host_op_us": dict(sorted(per_host.items(), key=lambda kv: -kv[1]))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--min-us", type=float, default=20.0)
    parser.add_argument("--show", type=int, default=25, help="gaps listed (largest first)")
    args = parser.parse_args(argv)
    result = gaps(load(args.trace), args.min_us)
    if result["host_before_first_kernel_us"] is None:
        print("no device events in the marked forward (a CPU trace?)")
        return 1
    print(f"host before the first kernel: {result['host_before_first_kernel_us']:.0f} us; "
          f"idle in gaps >= {args.min_us:.0f} us: {result['idle_us']:.0f} us in {len(result['gaps'])} gaps")
    for gap in sorted(result["gaps"], key=lambda g: -g["idle_us"])[:args.show]:
        print(f"  at {gap['start_us'] / 1e3:8.2f} ms idle {gap['idle_us']:8.1f} us before {gap['next_kernel']}")
        for name, duration in gap["host"]:
            print(f"      host: {name} ({duration} us)")
    print("idle attributed to host operations (us):")
    for name, micros in list(result["idle_by_host_op_us"].items())[:15]:
        print(f"  {micros:9.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
