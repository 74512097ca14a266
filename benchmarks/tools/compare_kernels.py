#!/usr/bin/env python3
"""The same GPU kernels in two variants of one dit.py run: calls and time per forward, side by side.

    python benchmarks/tools/compare_kernels.py benchmarks/results/dit-full-flux2-s6h.json \
        kopt-fp8 fp8+torch.compile-fast-accum

Reads the profiler's top kernels that ``dit.py`` stores per variant and lists those whose exact name
appears in both, with the ratio of their times. Why: when a compiled variant's GEMM or attention time
rises against eager although the kernels (and call counts) are identical, the cause is the card
(clock, power), not the code; only a name-for-name comparison shows that.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def top_kernels(results: dict, variant: str, call: str = "forward") -> dict[str, dict]:
    for breakdown in results["breakdown"]:
        if breakdown["variant"] == variant and breakdown.get("call", "forward") == call:
            return {k["name"]: k for k in breakdown["top"]}
    raise SystemExit(f"no {call} breakdown for variant {variant!r}; have "
                     f"{sorted({b['variant'] for b in results['breakdown']})}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a dit-*.json file")
    parser.add_argument("base", help="variant, e.g. eager")
    parser.add_argument("other", help="variant, e.g. torch.compile")
    parser.add_argument("--categories", default="gemm,attention", help="comma-separated; 'all' for every one")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    base, other = top_kernels(results, args.base), top_kernels(results, args.other)
    wanted = None if args.categories == "all" else set(args.categories.split(","))
    print(f"| kernel | category | calls {args.base} / {args.other} | ms {args.base} | ms {args.other} | ratio |")
    print("|---|---|---:|---:|---:|---:|")
    for name in base.keys() & other.keys():
        a, b = base[name], other[name]
        if wanted is not None and a["category"] not in wanted:
            continue
        print(f"| {name[:70]} | {a['category']} | {a['calls_per_forward']:.0f} / {b['calls_per_forward']:.0f} "
              f"| {a['ms']:.2f} | {b['ms']:.2f} | {b['ms'] / a['ms']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
