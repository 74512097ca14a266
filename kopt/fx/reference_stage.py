"""A small step-invariant stage computed op by op in the reference's precision, not lowered by Inductor.

The step-invariant stage (:mod:`kopt.passes.graph.staging`) runs once per distinct value of its
inputs: once per prompt for FLUX.1's guidance and position tables, once per step for a timestep
embedding. When it is small (a few embedding MLPs and sinusoids, FLUX.1's 102 nodes reading 21 MiB of
weights), what Inductor gives it is not worth what it costs: lowering FLUX.1's took 9 s of a 37 s
cold compile on an H100 and 2.5 s of an 11 s warm one, for a stage that runs in microseconds either
way. Here it runs as the reference computation does (:func:`kopt.reference.run_reference`: every
op in float32 on a GPU, weights upcast op by op) and its outputs are rounded once to the dtypes and
layouts the per-call stage was compiled for.

Valid because the outputs are the reference's values rounded once, at least as close to the
reference as any lowering in the working precision: eager's ``guidance.to(bf16) * 1000`` rounding
(3500 -> 3504 before a sinusoid, :mod:`kopt.fx.precision_hazards`) does not happen, as in Inductor's
fused kernel. What it costs: the stage's weights upcast per run (at most :data:`MAX_CONSTANT_BYTES`)
and its ops unfused; bounded by both limits below, it stays far below a millisecond.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kopt.reference import run_reference

MAX_CONSTANT_BYTES = 64 << 20  # weights the stage reads: FLUX.1's 21 MiB; a whole model's modulation GEMMs are GBs
MAX_GEMM_FLOPS = 1e9  # GEMM work in float32: FLUX.1's 3.1 MFLOP; 1 GFLOP is well under a millisecond on a GPU


def runs_in_reference_precision(gemm_flops: float, constant_bytes: int) -> bool:
    """Whether a step-invariant stage this small is computed op by op in the reference's precision."""
    return gemm_flops <= MAX_GEMM_FLOPS and constant_bytes <= MAX_CONSTANT_BYTES


class ReferencePrecisionStage:
    """``graph_module(*args)`` computed in the reference's precision; each output rounded to the dtype,
    shape and strides of ``like`` (what the stage gives in the working precision, and what the next
    stage was compiled for)."""

    def __init__(self, graph_module: torch.fx.GraphModule, like: Sequence[Any]) -> None:
        self.graph_module = graph_module
        self.layouts = [(t.dtype, t.shape, t.stride()) if isinstance(t, torch.Tensor) else None for t in like]

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        outs = run_reference(self.graph_module, *args)
        return tuple(_laid_out(out, layout) for out, layout in zip(outs, self.layouts, strict=True))


def _laid_out(out: Any, layout: tuple[torch.dtype, torch.Size, tuple[int, ...]] | None) -> Any:
    if layout is None or not isinstance(out, torch.Tensor):
        return out
    dtype, shape, stride = layout
    if out.dtype == dtype and out.stride() == stride:
        return out
    return torch.empty_strided(shape, stride, dtype=dtype, device=out.device).copy_(out)
