"""Fuse a linear's bias and tanh GELU into the GEMM's epilogue: one ``kopt::linear_gelu_tanh``.

    h = addmm(b, x, Wt)                 or   h = mm(x, Wt) + b   (after bias absorption)
    y = gelu(view?(h), approximate="tanh")
  → y = view?(kopt.linear_gelu_tanh(x, Wt, b))

DiT feed-forwards (FLUX.1, LTX-Video, Wan, Qwen-Image, SD3) spell their up-projection this way;
left to Inductor, the GELU (with the absorbed bias) is a separate elementwise kernel that reads and
writes the whole (M, N) activation.

Valid when the GELU is the tanh approximation (cuBLASLt's epilogue computes only that one), ``b`` is
1-D of the GEMM's width N (a per-column bias), the GEMM's output feeds nothing but this GELU
(through reshapes), and the reshape, if any, only splits the rows (so it applies to the fused
output unchanged). Contract: tolerance — the epilogue adds the bias and applies GELU to the float32
accumulator before the one rounding, where the unfused graph rounds the GEMM's output first.

In ``"auto"`` (the bf16 pipeline; with ``fp8=...`` the FP8 GEMMs take these linears): on an H200,
``benchmarks/micro/linear_epilogue.py`` times the fused form 8-12 % below GEMM + Inductor's GELU
kernel at the feed-forward shapes of LTX-Video, FLUX.1 and Qwen-Image, with the bias either in the
GEMM or absorbed; the GEMM with the epilogue is slower, the elementwise pass it removes costs more.
"""

from __future__ import annotations

import torch

from kopt.fx.graph_utils import RESHAPES, meta_value, replace
from kopt.fx.symbolic import static_int
from kopt.kernels import linear_gelu as _registers_the_op  # noqa: F401  (torch.ops.kopt.linear_gelu_tanh)
from kopt.passes.base import Contract, Pass, PassContext, accepted_matches

aten = torch.ops.aten
RULE = "linear-gelu-tanh"


def _behind_reshapes(node: object) -> tuple[object, bool]:
    """The first non-reshape node behind ``node``, and whether it and every reshape on the way have
    one reader (else the fused op would leave them computing the unfused value anyway)."""
    sole = True
    while isinstance(node, torch.fx.Node) and node.target in RESHAPES:
        sole = sole and len(node.users) == 1
        node = node.args[0]
    return node, sole and isinstance(node, torch.fx.Node) and len(node.users) == 1


def _gemm_and_bias(node: object) -> tuple[torch.fx.Node, object] | None:
    """(the 2-D GEMM, the bias) when ``node`` is ``addmm(b, x, Wt)`` or ``mm(x, Wt) + b``."""
    if not isinstance(node, torch.fx.Node):
        return None
    if node.target is aten.addmm.default and not node.kwargs:
        return node, node.args[0]
    if node.target is aten.add.Tensor and not node.kwargs and len(node.args) == 2:
        for gemm_side, bias in ((node.args[0], node.args[1]), (node.args[1], node.args[0])):
            gemm, sole = _behind_reshapes(gemm_side)
            if sole and gemm.target is aten.mm.default:
                return gemm, bias
    return None


def match(gelu: torch.fx.Node) -> tuple[list[int], object, object, object] | str | None:
    """(the GELU input's shape, -1 for its one dynamic size; x, Wt, b) of a fusable linear + tanh
    GELU, else why not."""
    source, sole = _behind_reshapes(gelu.args[0])
    found = _gemm_and_bias(source)
    if found is None:
        return None  # not a linear's output: nothing to report
    if not sole:
        return "the linear's output is read elsewhere too: the fused op would compute it twice"
    if gelu.kwargs.get("approximate", gelu.args[1] if len(gelu.args) > 1 else "none") != "tanh":
        return "exact (erf) GELU: cuBLASLt's epilogue computes the tanh approximation only"
    gemm, bias = found
    x, weight_t = (gemm.args[1], gemm.args[2]) if gemm.target is aten.addmm.default else gemm.args[:2]
    out, bias_value = meta_value(gemm), meta_value(bias)
    if out is None or out.dim() != 2 or bias_value is None or bias_value.dim() != 1:
        return "not a 2-D GEMM with a 1-D bias"
    if bias_value.shape[0] != out.shape[1] or bias_value.dtype != out.dtype:
        return "the bias is not one value per output column, in the GEMM's dtype"
    gelu_in = meta_value(gelu.args[0])
    if gelu_in is None or gelu_in.shape[-1] != out.shape[1]:
        return "a reshape between the GEMM and the GELU moves the columns"
    shape = [static_int(size) for size in gelu_in.shape]
    if shape.count(None) > 1:
        return "more than one dynamic size in the GELU's input: its shape cannot be written as a view"
    return [-1 if size is None else size for size in shape], x, weight_t, bias


def emit(graph: torch.fx.Graph, found: tuple[list[int], object, object, object]) -> torch.fx.Node:
    """The fused op for a :func:`match` (at the graph's insertion point), viewed back to the GELU
    input's shape when that is not 2-D."""
    shape, x, weight_t, bias = found
    fused = graph.call_function(torch.ops.kopt.linear_gelu_tanh.default, (x, weight_t, bias))
    return graph.call_function(aten.view.default, (fused, shape)) if len(shape) != 2 else fused


class FuseLinearGelu(Pass):
    name = "fuse-linear-gelu"
    why = "a linear's bias and tanh GELU run in the GEMM's epilogue, not as a pass over its output"
    contract = Contract.tolerance(1e-2)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        for gelu, found in accepted_matches(graph, aten.gelu.default, match, ctx, RULE):
            with graph.inserting_before(gelu):
                out = emit(graph, found)
            replace(gelu, out, pass_name=self.name, rule=RULE)
            graph.erase_node(gelu)
        graph.eliminate_dead_code()
