"""Pair Q's and K's norm + RoPE kernels that rotate by the same tables into one kernel.

    q = kopt.qk_norm_rope(xq, wq, cos, sin, eps_q, mode)
    k = kopt.qk_norm_rope(xk, wk, cos, sin, eps_k, mode)
  → q, k = kopt.qk_norm_rope_pair(xq, wq, eps_q, xk, wk, eps_k, cos, sin, mode)

Why: both kernels read the tables; the pair reads them once (with LTX-Video's (S, 2048) float32
tables, the second read is a third of the two kernels' bytes). Runs after the passes that emit
``kopt::qk_norm_rope`` (``fuse-qk-norm-rope``, ``fuse-qk-norm-rope-real``) and after
``fuse-joint-attention-input``, which joins per-stream ops instead.

Valid when the two ops read the same tables (the same node, or the same chain of views and casts
of one node), have one mode and inputs of one shape and dtype, and the second op's inputs exist
where the first op runs (computed before it, or by pure nodes that do not depend on it: those are
moved up, :func:`kopt.fx.graph_utils.hoistable`). Each output is the very computation of the op it
replaces, with its own weight and eps. Contract: tolerance — the same arithmetic per row, but the pair's launch config
(rows and warps per program) is tuned on its own, and a row's sum of squares may be reduced in
another order.
"""

from __future__ import annotations

import operator

import torch

from kopt.fx.graph_utils import hoistable, meta_value, pure_key, replace, stamp
from kopt.fx.symbolic import same_sizes
from kopt.kernels import qk_norm_rope as _registers_single  # noqa: F401  (torch.ops.kopt.qk_norm_rope)
from kopt.kernels import qk_norm_rope_pair as _registers_the_op  # noqa: F401  (torch.ops.kopt.qk_norm_rope_pair)
from kopt.passes.base import Contract, Pass, PassContext

aten = torch.ops.aten
RULE = "qk-norm-rope-pair"
SINGLE = torch.ops.kopt.qk_norm_rope.default
# Ops that only re-view or re-type one value: two of them on equal arguments are the same table.
_VIEWS_AND_CASTS = frozenset({aten.squeeze.dim, aten.unsqueeze.default, aten._to_copy.default, aten.view.default,
                              aten.slice.Tensor, aten.select.int, aten.expand.default, aten.permute.default,
                              aten.transpose.int, aten.reshape.default, aten._unsafe_view.default,
                              aten.view_as_real.default})


def table_key(node: torch.fx.Node) -> object:
    """Equal for two table arguments that are the same value: one node, one constant, or equal chains
    of views and casts of one (each fusion that emits a ``qk_norm_rope`` converts the table itself)."""
    if node.op == "get_attr" or (node.op == "call_function" and node.target in _VIEWS_AND_CASTS):
        return pure_key(node, table_key)
    return node


def _group_key(node: torch.fx.Node) -> object:
    x, _, cos, sin, _, mode = node.args
    value = meta_value(x)
    return (table_key(cos), table_key(sin), mode, None if value is None else value.dtype)


def why_not_pair(first: torch.fx.Node, second: torch.fx.Node) -> list[torch.fx.Node] | str:
    """The nodes to move before ``first`` for the pair to replace both, or why they cannot pair."""
    a, b = meta_value(first.args[0]), meta_value(second.args[0])
    if a is None or b is None or not same_sizes(a.shape, b.shape):
        return "Q and K differ in shape (cross-attention or grouped heads): one kernel rotates one shape"
    moves = hoistable(second.args, first)
    if moves is None:
        return "the second op's input is computed after the first op, from its result or with effects"
    return moves


class FuseQKNormRopePair(Pass):
    name = "fuse-qk-norm-rope-pair"
    why = "Q's and K's norm + RoPE in one kernel that reads the rotary tables once"
    contract = Contract.tolerance(1e-5)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        groups: dict[object, list[torch.fx.Node]] = {}
        for node in graph.nodes:
            if node.op == "call_function" and node.target is SINGLE:
                groups.setdefault(_group_key(node), []).append(node)
        for members in groups.values():
            self._pair_up(graph, members, ctx)
        graph.eliminate_dead_code()

    def _pair_up(self, graph: torch.fx.Graph, members: list[torch.fx.Node], ctx: PassContext) -> None:
        """Pair each op with the first later one of its group it can pair with, in graph order."""
        waiting = list(members)
        while len(waiting) >= 2:
            first = waiting.pop(0)
            reasons = []
            for second in waiting:
                found = why_not_pair(first, second)
                if isinstance(found, str):
                    reasons.append(found)
                    continue
                if ctx.fire(RULE, first):
                    for moved in found:
                        first.prepend(moved)
                    self._emit(graph, first, second)
                waiting.remove(second)
                break
            else:
                ctx.decline(RULE, first, reasons[0])
        for left in waiting:
            ctx.decline(RULE, left, "no other op rotates by the same tables: nothing to pair with")

    def _emit(self, graph: torch.fx.Graph, first: torch.fx.Node, second: torch.fx.Node) -> None:
        x, weight, cos, sin, eps, mode = first.args
        x2, weight2, _, _, eps2, _ = second.args
        with graph.inserting_before(first):
            pair = graph.call_function(torch.ops.kopt.qk_norm_rope_pair.default,
                                       (x, weight, eps, x2, weight2, eps2, cos, sin, mode))
            outs = [graph.call_function(operator.getitem, (pair, i)) for i in (0, 1)]
        if "val" in first.meta and "val" in second.meta:
            pair.meta["val"] = (first.meta["val"], second.meta["val"])
        stamp(pair, pass_name=self.name, rule=RULE)
        for old, new in zip((first, second), outs, strict=True):
            replace(old, new, pass_name=self.name, rule=RULE)
            graph.erase_node(old)
