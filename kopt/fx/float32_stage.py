"""A small step-invariant stage computed op by op in float32, not lowered by Inductor.

The step-invariant stage (:mod:`kopt.passes.graph.staging`) runs once per distinct value of its
inputs: once per prompt for FLUX.1's guidance and position tables, once per step for a timestep
embedding. When it is small (a few embedding MLPs and sinusoids, FLUX.1's 102 nodes reading 42 MiB of
weights), what Inductor gives it is not worth what it costs: lowering FLUX.1's took 9 s of a 37 s
cold compile on an H100 and 2.7 s of an 11.1 s warm one, for a stage that runs in microseconds either
way. Here it runs under the reference's machinery (:func:`kopt.reference.run_reference`, weights
upcast op by op) in float32: every bf16 or fp16 op computes in float32, as in Inductor's kernels,
while float32 and float64 ops, the model's own explicit choices, stay as written. kopt's kernels and
FP8 ops run as rewritten, on their inputs in the dtypes the graph recorded
(:func:`runs_as_recorded`). The outputs are rounded once to the dtypes (and, at the recorded sizes,
the strides) the per-call stage was compiled for.

Valid because every other op computes what Inductor's fused kernels compute, in float32 with one
rounding at the end: eager's ``guidance.to(bf16) * 1000`` rounding (3500 -> 3504 before a sinusoid,
:mod:`kopt.fx.precision_hazards`) does not happen, as in Inductor's kernel, and a float32 model's
stage computes exactly what it computes eagerly. What it costs: the stage's low-precision weights
upcast per run (at most :data:`MAX_CONSTANT_BYTES`) and its ops unfused; bounded by both limits
below, it stays far below a millisecond.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kopt.reference import run_reference

MAX_CONSTANT_BYTES = 64 << 20  # weights the stage reads: FLUX.1's 42 MiB; a whole model's modulation GEMMs are GBs
MAX_GEMM_FLOPS = 1e9  # GEMM work in float32: FLUX.1's 3.1 MFLOP; 1 GFLOP is well under a millisecond on a GPU


def computed_in_float32(gemm_flops: float, constant_bytes: int) -> bool:
    """Whether a step-invariant stage this small is computed op by op in float32."""
    return gemm_flops <= MAX_GEMM_FLOPS and constant_bytes <= MAX_CONSTANT_BYTES


class Float32Stage:
    """``graph_module(*args)`` computed in float32 (module docstring); each output rounded to the dtype,
    shape and strides of ``like`` (what the stage gives in the working precision, and what the next
    stage was compiled for)."""

    def __init__(self, graph_module: torch.fx.GraphModule, like: Sequence[Any]) -> None:
        self.graph_module = graph_module
        self.layouts = [(t.dtype, t.shape, t.stride()) if isinstance(t, torch.Tensor) else None for t in like]

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        outs = run_reference(_AsRecordedWhereQuantized(self.graph_module).run, *args, dtype=torch.float32)
        return tuple(_laid_out(out, layout) for out, layout in zip(outs, self.layouts, strict=True))


def runs_as_recorded(node: torch.fx.Node) -> bool:
    """Whether ``node`` runs in the dtypes the graph recorded, outside the reference's upcasting: kopt's
    own kernels (written for the working precision) and any op that takes or makes float8 values (an
    FP8 GEMM takes its scales in exactly the dtype it was given). Their inputs are rounded back to the
    recorded dtypes; what follows them computes in float32 again."""
    target = node.target
    if node.op != "call_function":
        return False
    if isinstance(target, torch._ops.OpOverload) and target.namespace == "kopt":
        return True
    values = [a.meta.get("val") for a in node.all_input_nodes] + [node.meta.get("val")]
    return any(isinstance(v, torch.Tensor) and v.dtype in _FLOAT8 for v in values)


_FLOAT8 = {getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
           if hasattr(torch, name)}


class _AsRecordedWhereQuantized(torch.fx.Interpreter):
    """The graph run under the reference's mode, except :func:`runs_as_recorded` nodes, which run with
    the mode set aside on their inputs in the recorded dtypes."""

    def run_node(self, n: torch.fx.Node) -> Any:
        if not runs_as_recorded(n):
            return super().run_node(n)
        args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), self._as_recorded)
        with torch.utils._python_dispatch._disable_current_modes():
            return n.target(*args, **kwargs)

    def _as_recorded(self, node: torch.fx.Node) -> Any:
        value, recorded = self.env[node], node.meta.get("val")
        if isinstance(value, torch.Tensor) and isinstance(recorded, torch.Tensor) and value.dtype != recorded.dtype:
            return value.to(recorded.dtype)
        return value


def _laid_out(out: Any, layout: tuple[torch.dtype, torch.Size, tuple[int, ...]] | None) -> Any:
    """``out`` in the recorded dtype; at the recorded sizes, in the recorded strides too (a size that
    varies, under dynamic shapes, keeps the layout the computation gave: strides are then not fixed)."""
    if layout is None or not isinstance(out, torch.Tensor):
        return out
    dtype, shape, stride = layout
    if out.dtype != dtype:
        out = out.to(dtype)
    if out.shape == shape and out.stride() != stride and 0 not in stride:
        out = torch.empty_strided(shape, stride, dtype=dtype, device=out.device).copy_(out)
    return out
