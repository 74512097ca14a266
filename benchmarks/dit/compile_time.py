#!/usr/bin/env python3
"""Where ``kopt.compile`` spends its time on a deep model of tiny width, on this machine's CPU.

    python benchmarks/dit/compile_time.py --blocks 60                       # Qwen-Image's depth, eager lowering
    python benchmarks/dit/compile_time.py --blocks 60 --lower inductor      # with Inductor's lowering
    python benchmarks/dit/compile_time.py --blocks 60 --lower inductor --min-features 32 --inductor-info

Why: the pass pipeline's cost grows with the graph (one node per op of every block), not with the
width, so a 60-block Qwen-Image of tiny width has the full model's graph and compiles in minutes
on a laptop. It separates a compile-time regression in kopt's own work (capture, passes) from one
on the GPU machine (Triton compiles, autotuning, contention between jobs). Timings on a shared
2-core machine move by up to 2x between runs: compare commits by running each more than once.

``--min-features 32`` makes the tiny model's FP8 choices the full model's (the input, timestep and
output projections stay bf16, so the last block boundary is the graph's only non-quantizing gated
residual), and ``--inductor-info`` turns on Inductor's INFO log (to stderr), which torch 2.11 formats
even when it is off: together they reproduce the lowering stall that kopt/lower.py's
shallow_operator_messages prevents, which eager lowering with every linear quantized cannot show.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import kopt  # noqa: E402
from kopt.fp8 import Fp8Config  # noqa: E402
from kopt.workloads import qwen_image  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=60, help="transformer blocks (Qwen-Image has 60)")
    parser.add_argument("--lower", choices=["eager", "inductor"], default="eager")
    parser.add_argument("--min-features", type=int, default=1,
                        help="Fp8Config.min_features (32: the tiny model's FP8 choices are the full model's)")
    parser.add_argument("--inductor-info", action="store_true",
                        help="Inductor's INFO log on (torch 2.11 formats it even off)")
    args = parser.parse_args(argv)
    if args.inductor_info:
        import logging

        logging.getLogger("torch._inductor.graph").setLevel(logging.INFO)
    torch.manual_seed(0)
    from diffusers import QwenImageTransformer2DModel

    model = QwenImageTransformer2DModel(**{**qwen_image.TINY, "num_layers": args.blocks}).to(torch.bfloat16).eval()
    inputs = qwen_image.WORKLOAD.build_inputs("tiny", torch.device("cpu"), torch.bfloat16,
                                              torch.Generator().manual_seed(0), False)
    compiled = kopt.compile(model, fp8=Fp8Config(min_features=args.min_features, attention=True), lower=args.lower)
    start = time.perf_counter()
    with torch.no_grad():
        compiled(**inputs)
    first_call = time.perf_counter() - start
    graph = compiled.kopt_report.graphs[0]
    print(f"qwen-image, {args.blocks} blocks of tiny width, lower={args.lower}, "
          f"min_features={args.min_features}: first call {first_call:.1f} s "
          f"(capture and passes {graph.capture_seconds:.1f} s, lowering {graph.compile_seconds:.1f} s)")
    print("| pass | status | matches | seconds |\n|---|---|---:|---:|")
    for record in graph.passes:
        print(f"| {record.name} | {record.status.split(':')[0]} | {record.total_matches} | {record.seconds:.1f} |")
    print(f"| (all passes) | | | {sum(r.seconds for r in graph.passes):.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
