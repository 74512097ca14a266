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

import dataclasses
import operator
from collections.abc import Iterable

import torch

from kopt.codegen.ops import FLOAT_DTYPES, REDUCTIONS
from kopt.fx.symbolic import is_symbolic

aten = torch.ops.aten
Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Ref:
    """A reference to value ``index``: inputs are numbered first, then one value per step."""

    index: int


Arg = Ref | float | bool | None


@dataclasses.dataclass(frozen=True)
class Input:
    """A tensor the region reads; broadcast to the full shape when it is smaller."""

    node: str
    shape: Shape
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class Step:
    """One node of the region, normalized: ``op`` is a name in :mod:`kopt.codegen.ops` (or
    ``getitem``), ``args`` its operands, ``params`` reduction settings (keepdim, correction, eps)."""

    node: str
    target: str
    op: str
    args: tuple[Arg, ...]
    shape: Shape
    dtype: torch.dtype | None
    params: tuple[tuple[str, object], ...] = ()

    def param(self, name: str, default: object = None) -> object:
        return dict(self.params).get(name, default)


@dataclasses.dataclass(frozen=True)
class Output:
    """A region value read outside it: ``kind`` is ``full`` (the full shape), ``row`` (one value
    per row, ``(*rows, 1)``) or ``row_flat`` (``(*rows,)``, a reduction without keepdim)."""

    value: int
    node: str
    kind: str
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class Region:
    """What a generated kernel computes. The FX nodes ride along (not compared) for the rewrite."""

    inputs: tuple[Input, ...]
    steps: tuple[Step, ...]
    outputs: tuple[Output, ...]
    full_shape: Shape
    reduction: str | None
    members: tuple[torch.fx.Node, ...] = dataclasses.field(default=(), compare=False, repr=False)
    input_nodes: tuple[torch.fx.Node, ...] = dataclasses.field(default=(), compare=False, repr=False)
    output_nodes: tuple[torch.fx.Node, ...] = dataclasses.field(default=(), compare=False, repr=False)

    @property
    def n(self) -> int:
        return self.full_shape[-1]

    def value_dtype(self, index: int) -> torch.dtype | None:
        if index < len(self.inputs):
            return self.inputs[index].dtype
        return self.steps[index - len(self.inputs)].dtype

    def value_name(self, index: int) -> str:
        """The FX node name behind value ``index``."""
        if index < len(self.inputs):
            return self.inputs[index].node
        return self.steps[index - len(self.inputs)].node


# ------------------------------------------------------------------------------------- normalization
_BINARY = {aten.add.Tensor: "add", aten.add.Scalar: "add", aten.sub.Tensor: "sub", aten.sub.Scalar: "sub",
           aten.mul.Tensor: "mul", aten.mul.Scalar: "mul", aten.div.Tensor: "div", aten.div.Scalar: "div",
           aten.maximum.default: "maximum", aten.minimum.default: "minimum"}
_COMPARE = {getattr(getattr(aten, name), overload): name
            for name in ("gt", "lt", "ge", "le", "eq", "ne") for overload in ("Scalar", "Tensor")}
_UNARY = {aten.neg.default: "neg", aten.exp.default: "exp", aten.log.default: "log", aten.sqrt.default: "sqrt",
          aten.rsqrt.default: "rsqrt", aten.reciprocal.default: "reciprocal", aten.abs.default: "abs",
          aten.erf.default: "erf", aten.sin.default: "sin", aten.cos.default: "cos",
          aten.sigmoid.default: "sigmoid", aten.tanh.default: "tanh", aten.relu.default: "relu",
          aten.silu.default: "silu", aten.clone.default: "identity", aten.alias.default: "identity"}
_WHERE = (aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
_CLAMP = (aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default)
_REDUCE = {aten.sum.dim_IntList: "sum", aten.mean.dim: "mean", aten.amax.default: "amax",
           aten.amin.default: "amin", aten.var.correction: "var", aten.var_mean.correction: "var_mean",
           aten.native_layer_norm.default: "layer_norm"}
_FULL_REDUCE = {aten.sum.default, aten.mean.default, aten.amax.default, aten.amin.default}
_COPY_KWARGS = {"dtype", "layout", "device", "memory_format", "non_blocking"}


def is_candidate(node: torch.fx.Node) -> bool:
    """Whether ``node`` calls an op of the vocabulary (a cheap filter before full validation)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        source = node.args[0]
        return isinstance(source, torch.fx.Node) and source.target in (aten.var_mean.correction,
                                                                       aten.native_layer_norm.default)
    if node.target is aten.unsqueeze.default:  # only to give a reduction without keepdim its last dim back
        source = node.args[0]
        rank = len(_shape(source) or ()) if isinstance(source, torch.fx.Node) else -1
        return node.args[1] in (-1, rank)
    return (node.target in _BINARY or node.target in _COMPARE or node.target in _UNARY or node.target in _WHERE
            or node.target in _CLAMP or node.target in _REDUCE or node.target in (
                aten.rsub.Scalar, aten.rsub.Tensor, aten.pow.Tensor_Scalar, aten.gelu.default,
                aten._to_copy.default))


def is_reduction(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a row reduction of the vocabulary (whatever its dims)."""
    return node.op == "call_function" and node.target in _REDUCE


def _arg(node: torch.fx.Node, position: int, name: str, default: object = None) -> object:
    if len(node.args) > position:
        return node.args[position]
    return node.kwargs.get(name, default)


def _shape(node: torch.fx.Node) -> Shape | None:
    """The node's shape: ints, or SymInts (symbolic sizes; ``int()`` would add a guard)."""
    value = node.meta.get("val")
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _reduction_dims_reason(node: torch.fx.Node, dims: object, source_rank: int) -> str | None:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return "reduction over all dims, not one row"
    dims = [dims] if isinstance(dims, int) else list(dims)  # type: ignore[arg-type]
    normalized = sorted({d % source_rank for d in dims})
    if normalized != [source_rank - 1]:
        return ("reduction over several dims" if len(normalized) > 1 else "reduction over a non-last dim") + \
            f" ({node.name}: dims {dims} of a rank-{source_rank} tensor)"
    return None


def _normalize(node: torch.fx.Node, ref: dict[torch.fx.Node, Ref]) -> tuple[str, tuple[Arg, ...], tuple] | str:
    """(op, operands, params) of ``node`` in the vocabulary, or why it is not expressible."""
    def operand(value: object) -> Arg:
        if isinstance(value, torch.fx.Node):
            return ref[value]
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, (int, float)):
            return float(value)
        raise TypeError(value)

    target, args = node.target, node.args
    try:
        if target in _BINARY or target in _COMPARE:
            alpha = node.kwargs.get("alpha", 1)
            if alpha != 1 or len(args) > 2:
                return f"{node.name}: {target} with alpha"
            return (_BINARY.get(target) or _COMPARE[target]), (operand(args[0]), operand(args[1])), ()
        if target in (aten.rsub.Scalar, aten.rsub.Tensor):
            if _arg(node, 2, "alpha", 1) != 1:
                return f"{node.name}: rsub with alpha"
            return "sub", (operand(args[1]), operand(args[0])), ()
        if target in _UNARY:
            return _UNARY[target], (operand(args[0]),), ()
        if target is aten.unsqueeze.default:  # is_candidate checked it appends the last dim
            return "identity", (operand(args[0]),), ()
        if target is aten.pow.Tensor_Scalar:
            return "pow", (operand(args[0]), operand(args[1])), ()
        if target is aten.gelu.default:
            approximate = _arg(node, 1, "approximate", "none")
            return ("gelu_tanh" if approximate == "tanh" else "gelu_erf"), (operand(args[0]),), ()
        if target in _WHERE:
            return "where", tuple(operand(a) for a in args[:3]), ()
        if target in _CLAMP:
            low = _arg(node, 1, "min") if target is not aten.clamp_max.default else None
            high = _arg(node, 2, "max") if target is aten.clamp.default else (
                _arg(node, 1, "max") if target is aten.clamp_max.default else None)
            if isinstance(low, torch.fx.Node) or isinstance(high, torch.fx.Node):
                return f"{node.name}: clamp with tensor bounds"
            return "clamp", (operand(args[0]), operand(low), operand(high)), ()
        if target is aten._to_copy.default:
            return _normalize_cast(node, operand(args[0]))
        if target in _REDUCE:
            return _normalize_reduction(node, operand)
    except (TypeError, KeyError) as error:
        return f"{node.name}: unsupported operand {error}"
    if target in _FULL_REDUCE:
        return f"reduction over all dims, not one row ({node.name})"
    return f"{node.name}: {target} is not in the codegen vocabulary"


def _normalize_cast(node: torch.fx.Node, source: Arg) -> tuple[str, tuple[Arg, ...], tuple] | str:
    unknown = set(node.kwargs) - _COPY_KWARGS
    if unknown or node.kwargs.get("layout") not in (None, torch.strided):
        return f"{node.name}: _to_copy with {sorted(unknown) or 'a layout change'}"
    source_node, value = node.args[0], node.meta.get("val")
    if node.kwargs.get("device") is not None and torch.device(node.kwargs["device"]) != value.device:
        return f"{node.name}: _to_copy changes device"
    source_dtype = source_node.meta["val"].dtype
    if value.dtype not in FLOAT_DTYPES:
        return f"{node.name}: cast to {value.dtype}"
    if source_dtype is torch.bool:
        return "to_float", (source,), ()
    op = {torch.bfloat16: "round_bf16", torch.float16: "round_fp16"}.get(value.dtype, "identity")
    return op, (source,), ()


def _normalize_reduction(node: torch.fx.Node, operand) -> tuple[str, tuple[Arg, ...], tuple] | str:
    kind = _REDUCE[node.target]
    source = node.args[0]
    rank = len(_shape(source) or ())
    if kind == "layer_norm":
        normalized_shape, weight, bias, eps = node.args[1:5]
        if len(normalized_shape) != 1:
            return f"{node.name}: layer norm over several dims"
        return kind, (operand(source), operand(weight), operand(bias)), (("eps", float(eps)),)
    reason = _reduction_dims_reason(node, _arg(node, 1, "dim"), rank)
    if reason:
        return reason
    if node.kwargs.get("dtype") is not None:
        return f"{node.name}: reduction with a dtype argument"
    params: tuple = (("keepdim", bool(_arg(node, 2, "keepdim", False))),)  # var: keyword-only, still found
    if kind in ("var", "var_mean"):
        correction = node.kwargs.get("correction")
        params += (("correction", 1.0 if correction is None else float(correction)),)
    return kind, (operand(source),), params


# ---------------------------------------------------------------------------------------- validation
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
        inputs.append(Input(node.name, _shape(node), value.dtype))
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
            step = Step(node.name, "getitem", "getitem", (ref[node.args[0]],), _shape(node),
                        node.meta["val"].dtype, (("index", int(node.args[1])),))
        else:
            normalized = _normalize(node, ref)
            if isinstance(normalized, str):
                return normalized
            op, args, params = normalized
            value = node.meta.get("val")
            single = isinstance(value, torch.Tensor)
            step = Step(node.name, str(node.target), op, args, _shape(node) if single else (),
                        value.dtype if single else None, params)
            if op in REDUCTIONS:
                reductions.append(node.name)
                if _shape(node.args[0]) != full:
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
            shape, dtype = _shape(node), node.meta["val"].dtype
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
            outputs.append(Output(ref[node].index, node.name, kind, dtype))
            output_nodes.append(node)
    if not outputs:
        return "nothing outside the region reads it"
    reason = _convexity_reason(members, input_nodes, position)
    if reason:
        return reason
    return Region(tuple(inputs), tuple(steps), tuple(outputs), full, reductions[0] if reductions else None,
                  tuple(members_list), tuple(input_nodes), tuple(output_nodes))
