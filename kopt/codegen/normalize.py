"""One FX node as a region step: its name in the op vocabulary of :mod:`kopt.codegen.ops`, its
operands and parameters, or a sentence saying why it cannot be one (a near-miss reason)."""

from __future__ import annotations

import operator

import torch

from kopt.codegen.ir import Arg, Ref, Shape
from kopt.codegen.ops import FLOAT_DTYPES

aten = torch.ops.aten


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
        rank = len(node_shape(source) or ()) if isinstance(source, torch.fx.Node) else -1
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


def node_shape(node: torch.fx.Node) -> Shape | None:
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


def normalize_step(node: torch.fx.Node, ref: dict[torch.fx.Node, Ref]) -> tuple[str, tuple[Arg, ...], tuple] | str:
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
            if target is aten.clone.default and _layout_change(node):
                return _layout_change(node)
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


def _layout_change(node: torch.fx.Node) -> str | None:
    """Why a copy (``clone``, ``_to_copy``) cannot be a step: it writes another memory layout than its
    source's (``.contiguous()`` of a transposed tensor), and a fused kernel writes each output in the
    layout of the region's elementwise inputs, so what follows (a ``view`` that needs the contiguous
    copy) would see the old layout (:func:`kopt.fx.layout.same_layout`)."""
    from kopt.fx.layout import same_layout

    source = node.args[0] if node.args else None
    before = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    after = node.meta.get("val")
    if not (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)) or before.dim() != after.dim():
        return None
    if same_layout(after.shape, before.stride(), after.stride()):
        return None
    return (f"{node.name}: copies into another memory layout (strides {tuple(before.stride())} -> "
            f"{tuple(after.stride())}), which a fused kernel would not")


def _normalize_cast(node: torch.fx.Node, source: Arg) -> tuple[str, tuple[Arg, ...], tuple] | str:
    unknown = set(node.kwargs) - _COPY_KWARGS
    if unknown or node.kwargs.get("layout") not in (None, torch.strided):
        return f"{node.name}: _to_copy with {sorted(unknown) or 'a layout change'}"
    if _layout_change(node):
        return _layout_change(node)
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
    rank = len(node_shape(source) or ())
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
