"""Skinny FP8 GEMMs: a row-scaled ``_scaled_mm`` with 1..4 rows and a large constant weight becomes
``kopt::fp8_gemv``, which streams the weight once.

    y = _scaled_mm(q_x, t(W8), scale_x, scale_W, bias=b, out_dtype=d)     q_x (M <= 4, K), W8 constant
  → y = kopt.fp8_gemv(q_x, scale_x, W8, scale_W, b, d, fast_accum)

Such a GEMM is a read of the weight (Qwen-Image's merged modulation weight: 6.8 GB against 6
MFLOP, once per timestep value), which cuBLAS read at 2.9 TB/s. The op tunes its kernel against
cuBLAS on the first call of each shape and keeps whichever is faster on the device, so the rewrite
never runs slower than the original. Valid because both compute the same row-scaled product of the
same FP8 values with float32 accumulation (cuBLAS's fast accumulation keeps shorter partial sums,
so the kernel's result is the closer one to exact): contract ``tolerance``. Runs after
``fp8-linear`` and the fusions that read its quantize nodes, before ``staging`` (which then hoists
the op with the rest of the step-invariant work).
"""

from __future__ import annotations

import torch

from kopt.fp8.quantize import FP8
from kopt.fx.constants import transposed_constant
from kopt.fx.graph_utils import meta_value, replace, stamp
from kopt.fx.symbolic import same_sizes, static_int
from kopt.kernels import fp8_gemv as _gemv_op
from kopt.passes.base import Contract, Pass, PassContext, accepted_matches

aten = torch.ops.aten
RULE = "fp8-gemv"
MIN_WEIGHT_BYTES = 8 << 20  # below ~2 µs of reading, a launch and a tuning entry are not worth it


def match(gemm: torch.fx.Node) -> tuple[torch.fx.Node, ...] | str | None:
    """(q_x, x_scale, W8, w_scale) of a skinny row-scaled FP8 GEMM with a constant weight, a reason
    to decline, or None for GEMMs with more rows (not candidates at all)."""
    if len(gemm.args) < 4:
        return None
    q_x, mat2, x_scale, w_scale = gemm.args[:4]
    x, out = meta_value(q_x), meta_value(gemm)
    rows = static_int(x.shape[0]) if x is not None and x.dim() == 2 else None  # symbolic rows: not skinny
    if out is None or rows is None or not 1 <= rows <= _gemv_op.MAX_ROWS:
        return None
    if set(gemm.kwargs) - {"bias", "out_dtype", "use_fast_accum"} or len(gemm.args) > 4:
        return "the GEMM has arguments beyond the bias, output dtype and fast accumulation"
    weight = transposed_constant(mat2)
    if weight is None:
        return "the weight operand is not the transpose of a constant"
    w, xs, ws = (meta_value(n) for n in (weight, x_scale, w_scale))
    if w is None or xs is None or ws is None or w.dtype != FP8 or x.dtype != FP8:
        return "not an FP8 x FP8 GEMM"
    if not same_sizes(xs.shape, (rows, 1)) or not same_sizes(ws.shape, (1, w.shape[0])):
        return "the scales are not row-wise (M, 1) and (1, N)"
    if w.numel() < MIN_WEIGHT_BYTES:
        return f"the weight is {w.numel() / 2**20:.1f} MiB, below {MIN_WEIGHT_BYTES >> 20} MiB: cuBLAS is kept"
    return q_x, x_scale, weight, w_scale


class Fp8Gemv(Pass):
    name = "fp8-gemv"
    why = "FP8 GEMMs of a few rows read their weight once, at copy bandwidth, where that beats cuBLAS"
    contract = Contract.tolerance(1e-2)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        for gemm, (q_x, x_scale, weight, w_scale) in accepted_matches(graph, aten._scaled_mm.default, match, ctx,
                                                                     RULE):
            bias = gemm.kwargs.get("bias")
            out_dtype = gemm.kwargs.get("out_dtype") or meta_value(gemm).dtype
            fast_accum = bool(gemm.kwargs.get("use_fast_accum", False))
            with graph.inserting_before(gemm):
                gemv = graph.call_function(torch.ops.kopt.fp8_gemv.default,
                                           (q_x, x_scale, weight, w_scale, bias, out_dtype, fast_accum))
            stamp(gemv, pass_name=self.name, rule=RULE)
            replace(gemm, gemv, pass_name=self.name, rule=RULE)
            graph.erase_node(gemm)
        graph.eliminate_dead_code()
