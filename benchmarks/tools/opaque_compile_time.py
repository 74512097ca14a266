#!/usr/bin/env python3
"""Compile + first call of a tiny zoo DiT with many blocks, per ``between_blocks``: kopt's own Python cost.

    python benchmarks/tools/opaque_compile_time.py --model ltx-video --blocks 28 --between-blocks compiled

The zoo's tiny configuration with the published block count (LTX-Video 28, FLUX.1 19 + 38), on the
CPU, graphs run op by op (``lower="eager"``, so Inductor's C++ compiles do not drown what is measured):
what remains is dynamo, kopt's capture and passes, and every propagation of shapes through the
model's graph, which under ``between_blocks="compiled"`` runs the blocks on fake tensors
(:mod:`kopt.fake_block_outputs`). Widths do not change that cost, the number of blocks does. Prints
one JSON line: the seconds of compile + first call, the median of ``--repeats`` fresh processes' worth
of compiles in this process (dynamo reset between them), and the output's error against float64; and,
of the model's own frame (the first graph, under ``"compiled"`` the one with every block call), the
seconds dynamo traced it before handing it to kopt and the bytecode steps it took (``trace_s``,
``trace_steps``: median over the repeats), with the code objects of the most steps (``steps_by_code``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

BLOCKS = {"ltx-video": {"num_layers": 28}, "flux1": {"num_layers": 19, "num_single_layers": 38}}


def build(model_name: str, blocks: dict[str, int]) -> tuple[torch.nn.Module, dict]:
    from kopt.workloads import get_workload

    workload = get_workload(model_name)
    tiny = workload.build_model("tiny")
    config = {k: v for k, v in dict(tiny.config).items() if not k.startswith("_")}
    torch.manual_seed(0)
    model = type(tiny)(**{**config, **blocks}).eval()
    inputs = workload.build_inputs("tiny", torch.device("cpu"), torch.float32, torch.Generator().manual_seed(1), False)
    return model, inputs


@contextlib.contextmanager
def tracing_probe(found: dict):
    """Count dynamo's bytecode steps, by code object, and time the trace until kopt's backend is first
    called; the totals go into ``found`` (``trace_s``, ``trace_steps``, ``steps_by_code``)."""
    from torch._dynamo import symbolic_convert

    from kopt.backend import KoptBackend

    steps: collections.Counter[str] = collections.Counter()
    state = {"tracing": True, "began": time.perf_counter()}
    step, call = symbolic_convert.InstructionTranslatorBase.step, KoptBackend.__call__

    def counted_step(tracer):  # noqa: ANN001, ANN202 - dynamo's own signature
        if state["tracing"]:
            code = tracer.f_code
            steps[f"{Path(code.co_filename).name}:{code.co_name}"] += 1
        return step(tracer)

    def first_call(backend, *args, **kwargs):  # noqa: ANN001, ANN202
        if state["tracing"]:
            state["tracing"] = False
            found.update(trace_s=time.perf_counter() - state["began"], trace_steps=sum(steps.values()),
                         steps_by_code=dict(steps.most_common(6)))
        return call(backend, *args, **kwargs)

    symbolic_convert.InstructionTranslatorBase.step = counted_step
    KoptBackend.__call__ = first_call
    try:
        yield
    finally:
        symbolic_convert.InstructionTranslatorBase.step, KoptBackend.__call__ = step, call


def main() -> None:
    import kopt
    from benchmarks.dit.measure import first_tensor
    from kopt.reference import reference_forward
    from kopt.verify import relative_error

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(BLOCKS), default="ltx-video")
    parser.add_argument("--between-blocks", default="compiled")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model, inputs = build(args.model, BLOCKS[args.model])
    seconds, traces = [], []
    with torch.no_grad():
        reference = first_tensor(reference_forward(model, **inputs))
        for _ in range(args.repeats):
            torch._dynamo.reset()
            began = time.perf_counter()
            compiled = kopt.compile(model, regional=True, between_blocks=args.between_blocks, lower="eager",
                                    progress=False)
            trace: dict = {}
            with tracing_probe(trace):
                out = first_tensor(compiled(**inputs))
            seconds.append(time.perf_counter() - began)
            traces.append(trace)
            compiled.undo()
    print(json.dumps({"model": args.model, "blocks": BLOCKS[args.model], "between_blocks": args.between_blocks,
                      "compile_and_first_call_s": round(statistics.median(seconds), 2),
                      "all_s": [round(s, 2) for s in seconds], "rel_err": relative_error(out, reference),
                      "trace_s": round(statistics.median(t["trace_s"] for t in traces), 2),
                      "trace_steps": statistics.median(t["trace_steps"] for t in traces),
                      "steps_by_code": traces[-1]["steps_by_code"]}))


if __name__ == "__main__":
    main()
