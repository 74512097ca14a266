#!/usr/bin/env python3
"""Where the host spends a compiled forward's time before and between its GPU launches (cProfile).

    python benchmarks/tools/host_profile.py --model flux1 --variant kopt --calls 20 [--size full]

Builds the workload as ``benchmarks/dit/dit.py`` does, prepares the variant, warms it up (compile,
CUDA-graph recording, the memo's first misses), then runs ``--calls`` stepping forwards under
cProfile with the device synchronised after each, and prints the functions by cumulative time
(and writes them to ``$OUT/host-profile-<model>-<variant>.txt`` when ``$OUT`` is set). What it
shows is host time per call: the part of a forward's latency that a replayed graph does not hide
when the GPU waits for the host (a synchronised call, or a step whose inputs the host prepares).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.dit.calls import stepping_forward  # noqa: E402
from benchmarks.dit.measure import synchronize  # noqa: E402
from benchmarks.dit.variants import Setup, select  # noqa: E402
from kopt.workloads import get_workload  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--variant", default="kopt")
    parser.add_argument("--size", choices=["tiny", "full"], default="full")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--top", type=int, default=45)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    workload = get_workload(args.model)
    torch.manual_seed(0)
    model = workload.model(args.size, device=device, dtype=dtype)
    inputs = workload.inputs(args.size, device=device, dtype=dtype, seed=0)
    (variant,) = select(args.variant, args.size, whole_model=False)
    with torch.no_grad():
        call = stepping_forward(workload, variant.prepare(model, Setup(args.size, device, dtype)).fn, inputs)
        for _ in range(6):  # compile, record, and past the memo's probing misses
            call()
        synchronize(device)
        profiler = cProfile.Profile()
        begin = time.perf_counter()
        profiler.enable()
        for _ in range(args.calls):
            call()
            synchronize(device)
        profiler.disable()
        seconds = time.perf_counter() - begin
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(args.top)
    report = (f"{args.model} {args.variant}: {args.calls} synchronised calls in {seconds:.3f} s under cProfile "
              f"({1e3 * seconds / args.calls:.2f} ms per call)\n{text.getvalue()}")
    print(report)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"host-profile-{args.model}-{args.variant}.txt").write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
