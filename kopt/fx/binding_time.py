"""Binding-time analysis: when can each node's value change?

A node is *constant* if it depends only on weights, shapes and literals; *step-invariant* if it
also depends on step-invariant inputs (timestep, guidance, position ids) but on nothing per-call;
*per-call* otherwise. The rule is the join over a node's inputs (constant < step-invariant <
per-call), which is sound because a pure function of unchanged values is unchanged. Impure and
random nodes are per-call whatever their inputs: their value changes on every execution.
"""

from __future__ import annotations

import torch

from kopt.config import Role

ORDER = {Role.CONSTANT: 0, Role.STEP_INVARIANT: 1, Role.PER_CALL: 2}
aten = torch.ops.aten

# Ops that only reinterpret their input's storage: computing them again costs nothing, so they are
# never worth folding or hoisting on their own.
VIEW_OPS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
            aten.permute.default, aten.t.default, aten.transpose.int, aten.unsqueeze.default,
            aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.slice.Tensor,
            aten.select.int, aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int,
            aten.alias.default, aten.view_as_real.default, aten.view_as_complex.default,
            aten.chunk.default, aten.narrow.default, aten.diagonal.default}


def is_view(node: torch.fx.Node) -> bool:
    import operator

    return node.op == "call_function" and (node.target in VIEW_OPS or node.target is operator.getitem)


def is_pure(node: torch.fx.Node) -> bool:
    """A node whose value is a function of its arguments alone (no randomness, no mutation)."""
    if node.op == "get_attr":
        return True
    if node.op != "call_function" or node.is_impure():
        return False
    schema = getattr(node.target, "_schema", None)
    if schema is not None:
        if schema.is_mutable:
            return False
        tags = getattr(node.target, "tags", ())
        if torch.Tag.nondeterministic_seeded in tags or torch.Tag.nondeterministic_bitwise in tags:
            return False
    return True


def binding_times(graph: torch.fx.Graph) -> dict[torch.fx.Node, Role]:
    """The binding time of every node except the output."""
    times: dict[torch.fx.Node, Role] = {}
    for node in graph.nodes:
        if node.op == "output":
            continue
        if node.op == "placeholder":
            times[node] = node.meta.get("kopt_role", Role.PER_CALL)
        elif node.op == "get_attr":
            times[node] = Role.CONSTANT
        elif not is_pure(node):
            times[node] = Role.PER_CALL
        else:
            inputs = node.all_input_nodes
            times[node] = max((times[i] for i in inputs), key=ORDER.__getitem__, default=Role.CONSTANT)
    return times
