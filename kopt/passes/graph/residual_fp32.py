"""Keep a DiT's residual stream in float32: the gated residual adds stop rounding to bf16.

    r1 = r0 + gate * y0;  r2 = r1 + gate' * y1; ...            (each r rounded to bf16)
  → r1 = r0.float() + gate * y0;  r2 = r1 + gate' * y1; ...    (float32; bf16 copies for other readers)

Why it is valid: every step still computes ``r + gate * y`` from the same operands; only the
rounding of the running sum to the storage dtype is dropped, so the result moves toward the exact
(higher-precision) value. A 57-block FLUX.1 rounds its image stream 76 times, an error that
compounds over the depth. Readers outside the stream (a norm on a ``cat`` of two
streams, the final norm) get a bf16 copy, i.e. the value eager would have stored: they are no worse
off, and the fused ``kopt::gated_residual`` normalizes the unrounded float32 sum directly.

What it matches (by what the graph computes, not by module names): chains of *steps*, each a
gated residual add ``add(r, mul(gate, y))`` with ``gate`` shaped (B, 1, N) or (B, N) and ``r``, ``y``
(B, S, N) in bf16/fp16, or a ``kopt::gated_residual`` (``fuse-gated-residual``'s op), linked
through their residual operand, also across ``cat`` and ``slice`` of stream values (FLUX's joint
stream of the single blocks); a chain needs two steps or more (one step alone would round at once).
A plain ``r + y``, or a ``kopt::gated_residual`` without a gate (``fuse-gated-residual`` fuses LTX-Video's
ungated cross-attention add), is not a step: it reads a bf16 copy and ends the chain, as before that
fusion existed. Widening it too would be as valid (the same sum, rounded less) but would carry the
stream in float32 through every LTX-Video block: 2 more bytes per element for the ungated op's read
and write and for the next step's read, a trade not measured yet.

Cost: the stream is read and written in 4 bytes instead of 2 by the steps. Runs after
``fuse-gated-residual`` (whose ops it widens) and before ``staging``. Contract: tolerance (judged
against the higher-precision reference, where it is the closer of the two).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator

import torch

from kopt.fx.graph_utils import meta_value, stamp
from kopt.fx.match.gated_sum import gated_sum
from kopt.kernels import gated_residual as _gated_op  # noqa: F401  (torch.ops.kopt.gated_residual)
from kopt.passes.base import Contract, Pass, PassContext

aten = torch.ops.aten
RULE = "residual-stream"
NARROW = (torch.bfloat16, torch.float16)
_CONVERT = torch.ops.prims.convert_element_type.default
_CARRIERS = (aten.cat.default, aten.slice.Tensor)  # ops that pass stream values on unchanged


def _stream_like(node: object) -> bool:
    value = meta_value(node)
    return value is not None and value.dim() == 3 and value.dtype in NARROW


def gated_add(node: torch.fx.Node) -> torch.fx.Node | None:
    """The residual operand of ``add(r, gate * y)`` (a step), or None."""
    found = gated_sum(node) if _stream_like(node) else "not a narrow stream"
    if isinstance(found, str):
        return None
    r = found[0]
    residual, out = meta_value(r), meta_value(node)
    return r if _stream_like(r) and residual is not None and out is not None and residual.dtype == out.dtype else None


def _fused_output(node: torch.fx.Node) -> torch.fx.Node | None:
    """``getitem(op, 0)`` of a gated ``kopt::gated_residual`` on a narrow stream (a step), or None."""
    op = node.args[0] if node.target is operator.getitem and node.args[1] == 0 else None
    if not (isinstance(op, torch.fx.Node) and op.target is torch.ops.kopt.gated_residual.default
            and op.args[2] is not None):  # ungated: a plain add, not a step (see the module docstring)
        return None
    return node if _stream_like(op.args[0]) and _stream_like(op.args[1]) else None


def _carried(node: torch.fx.Node, stream: set[torch.fx.Node]) -> list[torch.fx.Node] | None:
    """The stream values ``node`` (a cat over tokens, a slice of tokens) passes on, or None."""
    if node.target not in _CARRIERS or not _stream_like(node):
        return None
    if node.target is aten.cat.default:
        inputs, dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
        if dim in (-1, 2) or not all(_stream_like(x) for x in inputs):
            return None
        found = [x for x in inputs if x in stream]
    else:
        found = [node.args[0]] if node.args[0] in stream and node.args[1] not in (-1, 2) else []
    return found or None


class _Chains:
    """Stream values and the steps that produce them, grouped into connected chains."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.residual_of: dict[torch.fx.Node, torch.fx.Node] = {}  # step value -> its residual operand
        self.carriers: list[torch.fx.Node] = []
        self.parent: dict[torch.fx.Node, torch.fx.Node] = {}
        stream: set[torch.fx.Node] = set()
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            fused = _fused_output(node)
            residual = node.args[0].args[0] if fused is not None else gated_add(node)  # type: ignore[union-attr]
            if residual is not None:
                self.residual_of[node] = residual
                stream.add(node)
                if residual in stream:
                    self._union(node, residual)
                continue
            carried = _carried(node, stream)
            if carried:
                self.carriers.append(node)
                stream.add(node)
                for value in carried:
                    self._union(node, value)
        self.stream = stream

    def _find(self, node: torch.fx.Node) -> torch.fx.Node:
        while self.parent.get(node, node) is not node:
            node = self.parent[node]
        return node

    def _union(self, a: torch.fx.Node, b: torch.fx.Node) -> None:
        self.parent[self._find(a)] = self._find(b)

    def groups(self) -> Iterator[tuple[list[torch.fx.Node], list[torch.fx.Node]]]:
        """(steps, carriers) of each chain of two steps or more, in graph order."""
        members: dict[torch.fx.Node, tuple[list[torch.fx.Node], list[torch.fx.Node]]] = {}
        for node in self.stream:
            steps, carriers = members.setdefault(self._find(node), ([], []))
            (steps if node in self.residual_of else carriers).append(node)
        for steps, carriers in members.values():
            if len(steps) >= 2:
                yield steps, carriers


class ResidualStreamFp32(Pass):
    name = "residual-fp32"
    why = "the residual stream stops rounding to bf16 at every block: the output moves toward the reference"
    contract = Contract.tolerance(1e-2)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        chains = _Chains(graph)
        order = {node: i for i, node in enumerate(graph.nodes)}
        for steps, carriers in chains.groups():
            if all(ctx.fire(RULE, step) for step in steps):
                _widen(graph, sorted(steps + carriers, key=order.__getitem__), chains.residual_of)


def _widen(graph: torch.fx.Graph, chain: list[torch.fx.Node], residual_of: dict[torch.fx.Node, torch.fx.Node]) -> None:
    """Rewrite ``chain`` (steps and carriers, in graph order) in float32; bf16 copies for other readers."""
    wide: dict[torch.fx.Node, torch.fx.Node] = {}

    def widened(value: object) -> object:
        if not isinstance(value, torch.fx.Node):
            return value
        if value not in wide:
            with graph.inserting_after(value):
                wide[value] = graph.call_function(_CONVERT, (value, torch.float32))
        return wide[value]

    for node in chain:
        with graph.inserting_before(node):
            if node in residual_of and node.target is operator.getitem:  # a fused step: a new op, r widened
                op = node.args[0]
                new_op = graph.call_function(op.target, (widened(op.args[0]), *op.args[1:]), dict(op.kwargs))
                new = graph.call_function(operator.getitem, (new_op, 0))
                modulated = graph.call_function(operator.getitem, (new_op, 1))
                for user in list(op.users):
                    if user is not node:
                        user.replace_all_uses_with(modulated)
                stamp(new_op, pass_name=ResidualStreamFp32.name, rule=RULE)
            elif node in residual_of:
                residual = residual_of[node]
                args = [widened(a) if a is residual else a for a in node.args]
                new = graph.call_function(node.target, tuple(args))
            elif node.target is aten.cat.default:
                new = graph.call_function(node.target, ([widened(x) for x in node.args[0]], *node.args[1:]))
            else:
                new = graph.call_function(node.target, (widened(node.args[0]), *node.args[1:]), dict(node.kwargs))
        stamp(new, pass_name=ResidualStreamFp32.name, rule=RULE)
        wide[node] = new
    members = set(chain)
    for node in reversed(chain):  # readers outside the chain read a copy in the dtype they read before
        outside = [user for user in node.users if user not in members]
        if outside:
            with graph.inserting_after(wide[node]):
                narrow = graph.call_function(_CONVERT, (wide[node], meta_value(node).dtype))  # type: ignore[union-attr]
            for user in outside:
                user.replace_input_with(node, narrow)
    for node in reversed(chain):
        op = node.args[0] if node in residual_of and node.target is operator.getitem else None
        graph.erase_node(node)
        if isinstance(op, torch.fx.Node):
            for user in list(op.users):
                graph.erase_node(user)
            graph.erase_node(op)
