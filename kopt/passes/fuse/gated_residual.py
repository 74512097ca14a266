"""Fuse a gated residual into the adaLN that follows it: one ``kopt::gated_residual``.

    r_new = r + gate * y;  m = adaln_modulation(r_new, scale, shift)
  → r_new, m = kopt.gated_residual(r, y, gate, scale, shift, eps)

    r_new = r + y;  m = adaln_modulation(r_new, scale, shift)             (rule "plain-residual")
  → r_new, m = kopt.gated_residual(r, y, None, scale, shift, eps)

The residual stream is read once and written once instead of written by the add and read back
by the norm. Valid when the adaLN's norm has no weight (a LayerNorm, or an RMSNorm as in LTX-Video,
which the op takes as ``rms``), ``r`` and ``y`` have the same (B, S, N) shape and dtype and ``gate``
is a per-sample (B, 1, N) or (B, N) vector, or absent: the plain add of LTX-Video's cross-attention
output before ``norm2`` computes the same float32 sum, rounded the same way, with no gate loaded;
other readers of ``r_new`` read the op's first output, which is the same value. Runs after
``fuse-adaln``, whose ops it consumes. Contract: tolerance — ``r_new`` is rounded to the storage
dtype before it is normalized, as in the unfused graph, but the norm and modulation are computed
in float32 and rounded once.
"""

from __future__ import annotations

import operator

import torch

from kopt.fx.graph_utils import hoistable, meta_value, replace, stamp
from kopt.fx.match.gated_sum import residual_sum
from kopt.kernels import adaln_modulation as _adaln_op  # noqa: F401  (torch.ops.kopt.adaln_modulation)
from kopt.kernels import gated_residual as _gated_op  # noqa: F401  (torch.ops.kopt.gated_residual)
from kopt.passes.base import Contract, Pass, PassContext, accepted_matches

aten = torch.ops.aten
RULE = "gated-residual"
PLAIN_RULE = "plain-residual"  # r + y: the op without a gate


def match(adaln: torch.fx.Node) -> tuple[torch.fx.Node | None, ...] | str:
    """(residual_add, r, y, gate or None, late inputs) for the region feeding ``adaln``, or why it is
    not one."""
    x, _scale, _shift, weight, _eps, _rms = adaln.args
    if weight is not None:
        return "the norm has a weight (the fused kernel normalizes without one)"
    found = residual_sum(x)
    if isinstance(found, str):
        return f"the normalized input is {found}"
    r, y, gate = found
    values = [meta_value(n) for n in (r, y)]
    if values[0] is None or values[1] is None or values[0].dim() != 3 or values[0].dtype != values[1].dtype:
        return "residual and y differ in rank or dtype"
    late = _late_inputs(x, adaln)
    if late is None:
        return "the modulation's scale or shift is computed from the residual sum"
    return x, r, y, gate, late


def _late_inputs(residual_add: torch.fx.Node, adaln: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The nodes computing the modulation's scale and shift that come after ``residual_add`` (the
    fused op goes right after ``residual_add``, where some reader of ``r_new`` may already come, so
    these move up with it); None if one of them depends on ``residual_add`` or has effects."""
    return hoistable(adaln.args[1:3], residual_add)


class FuseGatedResidual(Pass):
    name = "fuse-gated-residual"
    why = "the residual stream is read and written once per block boundary instead of twice"
    contract = Contract.tolerance(1e-2)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        target = torch.ops.kopt.adaln_modulation.default
        for adaln, (residual_add, r, y, gate, _) in accepted_matches(
                graph, target, match, ctx, RULE, rule_of=lambda found: RULE if found[3] is not None else PLAIN_RULE):
            _, scale, shift, _, eps, rms = adaln.args
            late = _late_inputs(residual_add, adaln)  # again: an earlier rewrite may have moved nodes
            assert late is not None, "moving nodes earlier cannot make scale or shift depend on r_new"
            after = residual_add.next
            while after in late:  # already in place
                after = after.next
            for node in late:  # pure, and independent of r_new: computing them earlier changes nothing
                after.prepend(node)
            with graph.inserting_before(after):
                fused = graph.call_function(torch.ops.kopt.gated_residual.default,
                                            (r, y, gate, scale, shift, eps, bool(rms)))
                new_residual = graph.call_function(operator.getitem, (fused, 0))
                modulated = graph.call_function(operator.getitem, (fused, 1))
            stamp(fused, pass_name=self.name, rule=RULE)
            replace(adaln, modulated, pass_name=self.name, rule=RULE)
            replace(residual_add, new_residual, pass_name=self.name, rule=RULE)
        graph.eliminate_dead_code()
