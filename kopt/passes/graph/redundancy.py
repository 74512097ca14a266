"""Redundant-work elimination: common subexpressions, no-op views and casts, dead code.

Valid because the captured graph is functional (``functionalize`` removed mutation): a pure node
is a function of its target and arguments alone, so two nodes with equal ones compute equal
values, and a view or cast whose result has the input's shape, dtype, device and strides *is* the
input (a ``slice`` with the input's shape keeps every element, in place). Random and otherwise impure
ops are never merged or removed. With symbolic sizes, "the same shape" means provably the same for
every size (no guard is added).
"""

from __future__ import annotations

import torch

from kopt.fx.binding_time import is_pure
from kopt.fx.graph_utils import pure_key, replace
from kopt.fx.symbolic import same_sizes
from kopt.passes.base import Contract, Pass, PassContext

aten = torch.ops.aten

_NOOP_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default,
               aten.expand.default, aten.alias.default, aten.slice.Tensor}
_NOOP_COPIES = {aten.clone.default, aten._to_copy.default, aten.contiguous.default}


def _same_tensor_layout(a: object, b: object) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and same_sizes(a.shape, b.shape)
            and a.dtype == b.dtype and a.device == b.device and same_sizes(a.stride(), b.stride()))


def _noop_reason(node: torch.fx.Node) -> str | None:
    """Why ``node`` returns its first argument unchanged, or None if it may not."""
    if node.target not in _NOOP_VIEWS | _NOOP_COPIES or not node.args:
        return None
    source = node.args[0]
    if not isinstance(source, torch.fx.Node):
        return None
    if not _same_tensor_layout(node.meta.get("val"), source.meta.get("val")):
        return None
    if any(user.op == "output" for user in node.users):
        return None  # the caller would receive an alias of another value instead of a tensor of its own
    if node.target is aten._to_copy.default and set(node.kwargs) - {"dtype", "device", "layout"}:
        return None  # memory_format / pin_memory requests are not no-ops to be dropped silently
    return "same shape, dtype, device and strides as its input"


class RedundancyElimination(Pass):
    name = "redundancy"
    why = "equal pure computations are computed once; identity views and casts and dead nodes go"
    contract = Contract.exact()

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        seen: dict[object, torch.fx.Node] = {}
        for node in list(graph.nodes):
            if not is_pure(node):
                continue
            if node.op == "call_function" and _noop_reason(node) and ctx.fire("identity-view-or-cast", node):
                replace(node, node.args[0], pass_name=self.name, rule="identity-view-or-cast")
                graph.erase_node(node)
                continue
            try:
                key = pure_key(node)
                hash(key)
            except TypeError:
                ctx.decline("cse", node, "arguments are not hashable")
                continue
            earlier = seen.get(key)
            if earlier is None:
                seen[key] = node
            elif ctx.fire("cse", node):
                replace(node, earlier, pass_name=self.name, rule="cse")
                graph.erase_node(node)
        before = len(graph.nodes)
        graph.eliminate_dead_code()
        removed = before - len(graph.nodes)
        if removed:
            ctx.matches["dead-code"] = ctx.matches.get("dead-code", 0) + removed
