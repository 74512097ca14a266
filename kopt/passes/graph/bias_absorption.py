"""Bias absorption: a GEMM's bias add moves out of the GEMM into the elementwise region after it.

    y = addmm(b, x, W.T);  z = gate * y + residual
  → y = mm(x, W.T);        z = gate * (y + b) + residual     (one fused elementwise kernel)

Why: a bias applied by the GEMM is a broadcast copy of ``b`` into the output (or a separate
epilogue), then the elementwise region reads ``y`` again anyway; added in the region that already
reads ``y``, the bias costs no extra pass over memory and no standalone kernel. Valid when every
consumer of the GEMM's output (through views) is elementwise or a normalization, i.e. a region a
fusing code generator merges the add into. Contract: tolerance — ``x @ W.T`` is rounded to the
output dtype before ``b`` is added instead of once after (one extra rounding, ≤ 1 ulp).
"""

from __future__ import annotations

import torch

from kopt.fx.binding_time import is_view
from kopt.fx.constants import constant_value, transposed_constant
from kopt.fx.graph_utils import RESHAPES, op_name, replace, stamp
from kopt.passes.base import Contract, Pass, PassContext, accepted_matches

aten = torch.ops.aten
RULE = "bias-into-epilogue"
_NORMS = {aten.native_layer_norm.default, aten.native_group_norm.default, aten.mean.dim}


def consumers(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The first non-reshape nodes reading ``node``'s value."""
    found = []
    for user in node.users:
        if user.target in RESHAPES:
            found.extend(consumers(user))
        else:
            found.append(user)
    return found


def why_not_elementwise(node: torch.fx.Node) -> str | None:
    """None if ``node`` is elementwise or a norm (fusable with an add before it), else why not."""
    if node.op == "output":
        return "the GEMM output is a graph output: no region follows to take the bias"
    pointwise = torch.Tag.pointwise in getattr(node.target, "tags", ())
    if node.op == "call_function" and (pointwise or node.target in _NORMS):
        return None
    kind = "a view that is not a reshape" if is_view(node) else op_name(node)
    return f"consumer {node.name} is {kind}, not an elementwise region: the bias stays in the GEMM"


def match(node: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node] | str:
    """(bias, x, weight.T) of an ``addmm`` whose output only elementwise regions read, else why not."""
    if node.kwargs:
        return "addmm with alpha/beta: not a plain linear"
    bias, x, weight_t = node.args
    bias_value = constant_value(bias)
    if bias_value is None or bias_value.dim() != 1 or transposed_constant(weight_t) is None:
        return "not a linear with constant weight and 1-D constant bias"
    reasons = [r for r in map(why_not_elementwise, consumers(node)) if r]
    return reasons[0] if reasons else (bias, x, weight_t)


class BiasAbsorption(Pass):
    name = "bias-absorption"
    why = "a linear's bias is added in the elementwise region that reads its output anyway"
    contract = Contract.tolerance(1e-2)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        for node, (bias, x, weight_t) in accepted_matches(graph, aten.addmm.default, match, ctx, RULE):
            with graph.inserting_before(node):
                product = graph.call_function(aten.mm.default, (x, weight_t))
                biased = graph.call_function(aten.add.Tensor, (product, bias))
            stamp(product, pass_name=self.name, rule=RULE)
            replace(node, biased, pass_name=self.name, rule=RULE)
            graph.erase_node(node)
