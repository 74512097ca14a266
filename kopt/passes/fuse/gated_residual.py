"""Fuse a gated residual into the adaLN that follows it: one ``kopt::gated_residual``.

    r_new = r + gate * y;  m = adaln_modulation(r_new, scale, shift)
  → r_new, m = kopt.gated_residual(r, y, gate, scale, shift, eps)

The residual stream is read once and written once instead of written by the add and read back
by the norm. Valid when the adaLN is the LayerNorm form without weight, ``r`` and ``y`` have the
same (B, S, N) shape and dtype and ``gate`` is a per-sample (B, 1, N) or (B, N) vector; other
readers of ``r_new`` read the op's first output, which is the same value. Runs after
``fuse-adaln``, whose ops it consumes. Contract: tolerance — ``r_new`` is rounded to the storage
dtype before it is normalized, as in the unfused graph, but the norm and modulation are computed
in float32 and rounded once.
"""

from __future__ import annotations

import operator

import torch

from kopt.fx.graph_utils import meta_value, replace, stamp
from kopt.fx.match.gated_sum import gated_sum
from kopt.kernels import adaln_modulation as _adaln_op  # noqa: F401  (torch.ops.kopt.adaln_modulation)
from kopt.kernels import gated_residual as _gated_op  # noqa: F401  (torch.ops.kopt.gated_residual)
from kopt.passes.base import Contract, Pass, PassContext, accepted_matches

aten = torch.ops.aten
RULE = "gated-residual"


def match(adaln: torch.fx.Node) -> tuple[torch.fx.Node, ...] | str:
    """(residual_add, r, y, gate) for the region feeding ``adaln``, or why it is not one."""
    x, _scale, _shift, weight, _eps, rms = adaln.args
    if rms or weight is not None:
        return "the norm is an RMSNorm or has a weight"
    found = gated_sum(x)
    if isinstance(found, str):
        return f"the normalized input is {found}"
    r, y, gate = found
    values = [meta_value(n) for n in (r, y)]
    if values[0] is None or values[1] is None or values[0].dim() != 3 or values[0].dtype != values[1].dtype:
        return "residual and y differ in rank or dtype"
    return x, r, y, gate


class FuseGatedResidual(Pass):
    name = "fuse-gated-residual"
    why = "the residual stream is read and written once per block boundary instead of twice"
    contract = Contract.tolerance(1e-2)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        target = torch.ops.kopt.adaln_modulation.default
        for adaln, (residual_add, r, y, gate) in accepted_matches(graph, target, match, ctx, RULE):
            _, scale, shift, _, eps, _ = adaln.args
            with graph.inserting_before(adaln):
                fused = graph.call_function(torch.ops.kopt.gated_residual.default, (r, y, gate, scale, shift, eps))
                new_residual = graph.call_function(operator.getitem, (fused, 0))
                modulated = graph.call_function(operator.getitem, (fused, 1))
            stamp(fused, pass_name=self.name, rule=RULE)
            replace(adaln, modulated, pass_name=self.name, rule=RULE)
            replace(residual_add, new_residual, pass_name=self.name, rule=RULE)
        graph.eliminate_dead_code()
