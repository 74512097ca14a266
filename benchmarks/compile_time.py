#!/usr/bin/env python3
"""Where ``kopt.compile`` spends its time on a deep model of tiny width, on this machine's CPU.

    python benchmarks/compile_time.py --blocks 60                       # Qwen-Image's depth, eager lowering
    python benchmarks/compile_time.py --blocks 60 --lower inductor      # with Inductor's lowering

Why: the pass pipeline's cost grows with the graph (one node per op of every block), not with the
width, so a 60-block Qwen-Image of tiny width has the full model's graph and compiles in minutes
on a laptop. It separates a compile-time regression in kopt's own work (capture, passes) from one
on the GPU machine (Triton compiles, autotuning, contention between jobs). Timings on a shared
2-core machine move by up to 2x between runs: compare commits by running each more than once.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import kopt  # noqa: E402
from kopt.fp8 import Fp8Config  # noqa: E402
from kopt.workloads import qwen_image  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=60, help="transformer blocks (Qwen-Image has 60)")
    parser.add_argument("--lower", choices=["eager", "inductor"], default="eager")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    from diffusers import QwenImageTransformer2DModel

    model = QwenImageTransformer2DModel(**{**qwen_image.TINY, "num_layers": args.blocks}).to(torch.bfloat16).eval()
    inputs = qwen_image.WORKLOAD.build_inputs("tiny", torch.device("cpu"), torch.bfloat16,
                                              torch.Generator().manual_seed(0), False)
    compiled = kopt.compile(model, fp8=Fp8Config(min_features=1, attention=True), lower=args.lower)
    start = time.perf_counter()
    with torch.no_grad():
        compiled(**inputs)
    first_call = time.perf_counter() - start
    graph = compiled.kopt_report.graphs[0]
    print(f"qwen-image, {args.blocks} blocks of tiny width, lower={args.lower}: first call {first_call:.1f} s "
          f"(capture and passes {graph.capture_seconds:.1f} s, lowering {graph.compile_seconds:.1f} s)")
    print("| pass | status | matches | seconds |\n|---|---|---:|---:|")
    for record in graph.passes:
        print(f"| {record.name} | {record.status.split(':')[0]} | {record.total_matches} | {record.seconds:.1f} |")
    print(f"| (all passes) | | | {sum(r.seconds for r in graph.passes):.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
