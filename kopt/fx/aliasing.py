"""What memory the values of a dynamo graph (torch-level FX) may share, and which outputs hold no defined value.

The first-call checks run a graph's first call again and compare its outputs; both depend on this:
a graph that writes into its inputs would apply the write twice (:func:`writes_in_place`), and an
output that is an ``empty`` tensor nothing writes into (a buffer handed to the next graph, as
SGLang's FLUX.2 does across a graph break) holds whatever the allocator left there, so no contract
can say anything about its values (:func:`uninitialized_outputs`).
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

# Calls whose result may share memory with their first argument: a write into the result writes
# there too. Everything else (arithmetic, matmuls, clone, cat, ...) returns a fresh tensor.
_MAY_ALIAS = frozenset({
    "view", "view_as", "reshape", "transpose", "permute", "t", "unsqueeze", "squeeze", "flatten", "unflatten",
    "expand", "expand_as", "narrow", "select", "split", "chunk", "unbind", "getitem", "as_strided", "detach",
    "contiguous", "to", "type", "type_as", "float", "half", "bfloat16", "double", "movedim", "swapaxes",
    "diagonal", "real", "imag", "view_as_real", "view_as_complex", "alias",
})


def _name(node: torch.fx.Node) -> str:
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")


def _writes(node: torch.fx.Node) -> bool:
    name = _name(node)
    return (name.endswith("_") and not name.startswith("_")) or name == "setitem" or bool(node.kwargs.get("inplace"))


def _root(node: object) -> object:
    """What ``node`` may alias: follows possibly-aliasing calls back to where the memory comes from."""
    while isinstance(node, torch.fx.Node) and node.op in ("call_function", "call_method") and (
            _name(node) in _MAY_ALIAS or _writes(node)) and node.args:
        node = node.args[0]
    return node


def writes_in_place(graph: torch.fx.GraphModule) -> str | None:
    """The first node of a dynamo graph that may write into one of its inputs (None: none does).

    Checking the lowering runs the first call again; a graph writing into its inputs (a cache
    buffer, an input mutated by the forward) would apply the write again. A write into a tensor the
    graph made itself (``y = x.clone(); y[:, 0] = 0``) is harmless; one whose target may alias an
    input, through views and calls that can return their argument, counts.
    """
    for node in graph.graph.nodes:
        if node.op in ("call_function", "call_method") and _writes(node) and node.args:
            root = _root(node.args[0])
            if not isinstance(root, torch.fx.Node) or root.op in ("placeholder", "get_attr"):
                return f"{node.name} ({_name(node)})"
    return None


# factories whose result has no defined value until something writes into it
_UNINITIALIZED = frozenset({"empty", "new_empty", "empty_like", "empty_strided", "new_empty_strided"})


def _written_roots(graph: torch.fx.GraphModule) -> set[object]:
    """The roots of everything a node of ``graph`` may write into: in-place calls, ``out=``
    arguments, and arguments an op's schema marks as mutated."""
    roots: set[object] = set()
    for node in graph.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        if _writes(node) and node.args:
            roots.add(_root(node.args[0]))
        if isinstance(node.kwargs.get("out"), torch.fx.Node):
            roots.add(_root(node.kwargs["out"]))
        schema = getattr(node.target, "_schema", None)
        for position, argument in enumerate(schema.arguments if schema is not None else ()):
            if argument.alias_info is not None and argument.alias_info.is_write:
                value = node.args[position] if position < len(node.args) else node.kwargs.get(argument.name)
                roots.add(_root(value))
    return roots


def uninitialized_outputs(graph: torch.fx.GraphModule) -> frozenset[int]:
    """Positions (among the output's pytree leaves) of outputs that are an ``empty`` tensor, or a view
    of one, that no node of the graph writes into: their values are whatever memory held."""
    output = next(n for n in reversed(graph.graph.nodes) if n.op == "output")
    written = _written_roots(graph)
    found = set()
    for index, leaf in enumerate(pytree.tree_leaves(output.args[0])):
        root = _root(leaf)
        if isinstance(root, torch.fx.Node) and root.op in ("call_function", "call_method") and \
                _name(root) in _UNINITIALIZED and root not in written:
            found.add(index)
    return frozenset(found)
