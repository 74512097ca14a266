"""A fusible region: a set of FX nodes that one row-wise kernel can compute, in a graph-free form.

A region's values all live on the rows of one *full* shape ``(*rows, N)`` (the broadcast of its
inputs): every elementwise value is the full shape or broadcasts to it along the row dims or the
last dim, and at most one reduction over the last dim turns a row of N values into one value per
row (kept as ``(*rows, 1)`` or dropped to ``(*rows,)``). That is exactly what a kernel that holds
one whole row (or a block of rows) in registers can compute in one read of its inputs and one
write of its outputs, so the region is valid to fuse when :func:`build_region` accepts it: every
op is in the vocabulary of :mod:`kopt.codegen.ops`, values are float (or bool conditions), the
reduction is over the last dim only, outputs are full or per-row, and no node outside the region
both reads a region value and feeds the region (the fused op would depend on itself).

:func:`build_region` returns a :class:`Region` or a sentence saying why not; the sentences are the
near-miss reasons the ``codegen-fuse`` pass reports.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

import torch

from kopt.codegen.ir import Arg, Input, Output, Ref, Region, Shape, Step
from kopt.codegen.normalize import is_candidate, is_reduction, node_shape, normalize_step
from kopt.codegen.ops import FLOAT_DTYPES, REDUCTIONS
from kopt.fx.symbolic import is_symbolic

__all__ = ["Arg", "Input", "Output", "Positions", "Ref", "Region", "Shape", "Step", "build_region", "is_candidate",
           "is_reduction", "positions", "with_getitems"]

aten = torch.ops.aten


Positions = dict[torch.fx.Node, int]


def positions(graph: torch.fx.Graph) -> Positions:
    """Each node's index in ``graph`` (topological), for callers that build many regions."""
    return {n: i for i, n in enumerate(graph.nodes)}


def with_getitems(nodes: Iterable[torch.fx.Node], position: Positions) -> list[torch.fx.Node]:
    """``nodes`` with each tuple-valued member (var_mean, layer norm) and all its getitems, in graph order."""
    nodes = list(nodes)
    nodes += [n.args[0] for n in nodes if n.target is operator.getitem and isinstance(n.args[0], torch.fx.Node)
              and n.args[0].target in (aten.var_mean.correction, aten.native_layer_norm.default)]
    extra = [u for n in nodes if n.target in (aten.var_mean.correction, aten.native_layer_norm.default)
             for u in n.users if u.target is operator.getitem]
    return sorted(dict.fromkeys(nodes + extra), key=position.__getitem__)


def _convexity_reason(members: set[torch.fx.Node], inputs: list[torch.fx.Node], position: Positions) -> str | None:
    """Why the region cannot be one op: an outside node that both reads the region and feeds it."""
    first = min(position[n] for n in members)
    seen: set[torch.fx.Node] = set()
    stack = [n for n in inputs if position[n] > first]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for arg in node.all_input_nodes:
            if arg in members:
                return f"{node.name} is computed from the region and feeds it back"
            if position[arg] > first:
                stack.append(arg)
    return None


def _row_flat(node: torch.fx.Node, step: Step, row_flat: set[torch.fx.Node]) -> bool | str:
    """Whether ``node`` is a per-row value without its kept last dim (``(*rows,)``), or why it mixes
    such values with full-shape ones (right-aligned broadcasting would pair the wrong dims)."""
    flat_args = [a for a in node.all_input_nodes if a in row_flat]
    if step.op in REDUCTIONS:  # var_mean: its getitems follow it
        return node.target is not aten.native_layer_norm.default and not step.param("keepdim")
    if node.target is operator.getitem:
        return bool(flat_args)
    if node.target is aten.unsqueeze.default:
        return False if flat_args else f"{node.name}: unsqueeze of a value that is not a reduction without keepdim"
    if flat_args and len(flat_args) != len(node.all_input_nodes):
        return f"{node.name} mixes a reduction without keepdim with full values; keepdim rows broadcast back"
    return bool(flat_args)


def build_region(nodes: Iterable[torch.fx.Node], position: Positions | None = None) -> Region | str:
    """A :class:`Region` computing ``nodes`` (getitems of a member var_mean/layer norm are added),
    reading every other node they use as an input and exposing each value used outside; or a
    human-readable reason why one row-wise kernel cannot compute them. ``position`` (from
    :func:`positions`) saves recomputing node order when building many regions of one graph."""
    nodes = list(nodes)
    if not nodes:
        return "empty region"
    position = position if position is not None else positions(nodes[0].graph)
    members_list = with_getitems(nodes, position)
    members = set(members_list)
    ref: dict[torch.fx.Node, Ref] = {}
    input_nodes: list[torch.fx.Node] = []
    for node in members_list:
        if not is_candidate(node):
            return f"{node.name}: {node.target if node.op == 'call_function' else node.op} is not in the vocabulary"
        for arg in node.all_input_nodes:
            if arg not in members and arg not in ref:
                ref[arg] = Ref(len(input_nodes))
                input_nodes.append(arg)
    inputs = []
    for node in input_nodes:
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            return f"input {node.name} has no tensor metadata"
        if value.dtype not in FLOAT_DTYPES + (torch.bool,):
            return f"input {node.name} is {value.dtype}; the kernel computes in float32"
        if is_symbolic(value):
            return (f"input {node.name} has symbolic sizes {tuple(value.shape)} (dynamic shapes): generated "
                    "kernels are built for static shapes")
        inputs.append(Input(node.name, node_shape(node), value.dtype))
    try:
        full = tuple(torch.broadcast_shapes(*(i.shape for i in inputs)))
    except RuntimeError:
        return "inputs do not broadcast to one shape"
    if not full or 0 in full:
        return "the region is a scalar or empty"

    steps: list[Step] = []
    reductions: list[str] = []
    row_flat: set[torch.fx.Node] = set()
    for node in members_list:
        ref[node] = Ref(len(inputs) + len(steps))
        if node.target is operator.getitem:
            step = Step(node.name, "getitem", "getitem", (ref[node.args[0]],), node_shape(node),
                        node.meta["val"].dtype, (("index", int(node.args[1])),))
        else:
            normalized = normalize_step(node, ref)
            if isinstance(normalized, str):
                return normalized
            op, args, params = normalized
            value = node.meta.get("val")
            single = isinstance(value, torch.Tensor)
            step = Step(node.name, str(node.target), op, args, node_shape(node) if single else (),
                        value.dtype if single else None, params)
            if op in REDUCTIONS:
                reductions.append(node.name)
                if node_shape(node.args[0]) != full:
                    return f"{node.name} reduces a value broadcast along rows, not a full row"
        if step.dtype is not None and step.dtype not in FLOAT_DTYPES + (torch.bool,):
            return f"{node.name} is {step.dtype}; the kernel computes in float32"
        flat = _row_flat(node, step, row_flat)
        if isinstance(flat, str):
            return flat
        if flat:
            row_flat.add(node)
        steps.append(step)
    if len(reductions) > 1:
        return f"two reductions ({' and '.join(reductions)}); one kernel holds one row reduction"

    outputs, output_nodes = [], []
    for node in members_list:
        if node.target in (aten.var_mean.correction, aten.native_layer_norm.default):
            continue  # tuple-valued: its getitems are the outputs
        if any(user not in members for user in node.users):
            shape, dtype = node_shape(node), node.meta["val"].dtype
            if dtype is torch.bool:
                return f"{node.name} is a bool value needed outside the region"
            if shape == full:
                kind = "full"
            elif shape == full[:-1] + (1,):
                kind = "row"
            elif node in row_flat and shape == full[:-1]:
                kind = "row_flat"
            else:
                return f"{node.name} of shape {shape} is needed outside but is smaller than the rows {full}"
            if not node.meta["val"].is_contiguous():
                # the generated op writes contiguous outputs: a reader that relies on the layout eager
                # gave it (a view of a transposed copy) would fail, or see other strides
                return (f"{node.name} is needed outside laid out non-contiguously (strides "
                        f"{tuple(node.meta['val'].stride())}); the generated kernel writes contiguous rows")
            outputs.append(Output(ref[node].index, node.name, kind, dtype))
            output_nodes.append(node)
    if not outputs:
        return "nothing outside the region reads it"
    reason = _convexity_reason(members, input_nodes, position)
    if reason:
        return reason
    return Region(tuple(inputs), tuple(steps), tuple(outputs), full, reductions[0] if reductions else None,
                  tuple(members_list), tuple(input_nodes), tuple(output_nodes))
