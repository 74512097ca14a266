#!/usr/bin/env python3
"""Where a DiT run's time goes against its floor: GEMM FLOPs at a fixed rate plus eager's attention.

    python benchmarks/dit/floor.py benchmarks/results/dit-full-flux2-s6h.json [--tflops 1420] [--top 6]

The floor is issue 6's: the forward's GEMM FLOPs (``per_model.<m>.flops.gemm``, counted on one eager
forward) at ``--tflops`` (1420 TFLOP/s, FP8 on the H200), plus the eager row's attention kernel
time from the same file. For each profiled forward row it prints the median, the kernel time per
category with the GEMM and attention excess over the floor, the host gap, the profiled GPU idle
time between kernels per launch (runs with a timeline), and the largest kernels outside GEMM and
attention (what the elementwise time is made of).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def report(results: dict[str, Any], tflops: float, top: int) -> str:
    lines = []
    for model, info in results["per_model"].items():
        gemm_floor = info["flops"]["gemm"] / (tflops * 1e12) * 1e3
        breakdowns = [b for b in results["breakdown"] if b["model"] == model]
        eager = next((b for b in breakdowns if b["variant"] == "eager" and b["call"] == "forward"), None)
        if eager is None:
            lines.append(f"{model}: no profiled eager forward in this file (its attention time is the floor's)")
            continue
        attention_floor = eager["ms"]["attention"]
        lines += [f"## {model}: floor {gemm_floor:.1f} ms GEMM ({info['flops']['gemm'] / 1e12:.3f} TFLOP at "
                  f"{tflops:.0f} TFLOP/s) + {attention_floor:.1f} ms attention (eager) = "
                  f"{gemm_floor + attention_floor:.1f} ms", "",
                  "| variant | call | median ms | above floor | GEMM (+excess) | attention (+excess) | "
                  "elementwise | gap | idle µs per launch | largest other kernels (ms) |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        medians = {(r["variant"], r["call"]): r["median_ms"] for r in results["rows"] if r["model"] == model}
        for b in breakdowns:
            ms = b["ms"]
            others = [k for k in b["top"] if k["category"] not in ("gemm", "attention")][:top]
            median = medians.get((b["variant"], b["call"]))
            line = b.get("timeline")
            idle = f"{line['idle_between_kernels'] * 1e3 / b['launches']:.1f}" if line and b.get("launches") else "–"
            lines.append(
                f"| {b['variant']} | {b['call']} | {median:.2f} | {median - gemm_floor - attention_floor:.1f} | "
                f"{ms['gemm']:.2f} ({ms['gemm'] - gemm_floor:+.1f}) | "
                f"{ms['attention']:.2f} ({ms['attention'] - attention_floor:+.1f}) | "
                f"{ms['norm_elementwise'] + ms['copies'] + ms['other']:.2f} | {b['gap_ms']:.2f} | {idle} | "
                + ", ".join(f"{k['name'][:40]} {k['ms']:.2f}" for k in others) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a dit.py results JSON")
    parser.add_argument("--tflops", type=float, default=1420.0, help="the GEMM rate of the floor")
    parser.add_argument("--top", type=int, default=6, help="how many non-GEMM, non-attention kernels to name")
    args = parser.parse_args()
    print(report(json.loads(args.results.read_text()), args.tflops, args.top))


if __name__ == "__main__":
    main()
