"""Which keys an additive attention mask can touch: the window [start, end) outside of which it is
provably zero, read from how the graph builds it.

Qwen-Image builds its joint mask as ``where(cat([text_mask, ones(S_img)], -1), 0.0, -inf)``: only
the text keys can be masked, the image keys' bias is the constant 0. Attention kernels can skip the
bias add (one add per logit, 21 % of the FP8 attention kernel's time at Qwen-Image's shape) for key
tiles outside the window.

Valid because the analysis tracks, along the last (key) dimension, which positions hold a value
known at compile time, and follows only ops whose effect on each key position it knows exactly:
constant fills, casts, ``cat`` along the key dimension, ``where`` between two constants,
``masked_fill`` with a constant, logical not (of booleans), and views that keep the key dimension. Every other
node makes all its key positions unknown, so the window can only be too wide (no saving), never
too narrow (a wrong result).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from kopt.fx.graph_utils import meta_value
from kopt.fx.symbolic import known_equal, static_int

__all__ = ["UNKNOWN", "bias_window", "key_runs"]

aten = torch.ops.aten
UNKNOWN = object()  # a key position whose value depends on the inputs

# (length, value) runs along the key dimension, value a Python constant or UNKNOWN
Runs = list[tuple[int, object]]

_FILLS: dict[object, Callable[[torch.fx.Node], object]] = {
    aten.ones.default: lambda node: 1.0,
    aten.zeros.default: lambda node: 0.0,
    aten.full.default: lambda node: node.args[1],
    aten.ones_like.default: lambda node: 1.0,
    aten.zeros_like.default: lambda node: 0.0,
    aten.full_like.default: lambda node: node.args[1],
    aten.scalar_tensor.default: lambda node: node.args[0],
}
_WHERES = {aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar}
_KEY_PRESERVING_VIEWS = {aten.unsqueeze.default, aten.view.default, aten.reshape.default, aten._unsafe_view.default,
                         aten.expand.default, aten.alias.default, aten.clone.default}


def bias_window(mask: torch.fx.Node | None, keys: int) -> tuple[int, int]:
    """[start, end): the key positions where the additive mask may be nonzero; (0, keys) when it is
    not understood, (0, 0) when it is zero everywhere."""
    runs = key_runs(mask) if mask is not None else None
    if runs is None or sum(length for length, _ in runs) != keys:
        return 0, keys
    start, end, position = keys, 0, 0
    for length, value in runs:
        if length and not _is_zero(value):
            start, end = min(start, position), max(end, position + length)
        position += length
    return (start, end) if start < end else (0, 0)


def _is_zero(value: object) -> bool:
    return value is not UNKNOWN and not isinstance(value, bool) and float(value) == 0.0  # type: ignore[arg-type]


def _key_length(node: torch.fx.Node) -> int | None:
    """The key dimension's length; None when unknown, or symbolic (dynamic shapes: the analysis
    would have to guard on it, so it gives up and the window stays the whole key range)."""
    value = meta_value(node)
    return None if value is None or value.dim() == 0 else static_int(value.shape[-1])


def key_runs(node: object) -> Runs | None:
    """The node's values along its last dimension as runs; None when its length is unknown."""
    if not isinstance(node, torch.fx.Node):
        return None
    length = _key_length(node)
    if length is None:
        return None
    unknown: Runs = [(length, UNKNOWN)]
    if node.op != "call_function":
        return unknown
    target, args = node.target, node.args
    if target in _FILLS:
        fill = _FILLS[target](node)
        if not isinstance(fill, (int, float, bool)):
            return unknown  # a symbolic fill value
        return [(length, _cast(fill, meta_value(node).dtype))]
    if target is aten._to_copy.default or target is aten.to.dtype:
        dtype = node.kwargs.get("dtype", meta_value(node).dtype)
        runs = key_runs(args[0])
        return unknown if runs is None else [(n, _cast(v, dtype)) for n, v in runs]
    if target in _KEY_PRESERVING_VIEWS:
        source = args[0]
        if _key_length(source) != length or not _keeps_last_dim(node):
            return unknown
        return key_runs(source) or unknown
    if target is aten.cat.default:
        tensors, dim = args[0], args[1] if len(args) > 1 else node.kwargs.get("dim", 0)
        rank = meta_value(node).dim()
        if dim % rank != rank - 1:
            return unknown
        out: Runs = []
        for tensor in tensors:
            runs = key_runs(tensor)
            if runs is None:
                return unknown
            out += runs
        return out
    if target is aten.logical_not.default or (target is aten.bitwise_not.default
                                              and meta_value(node).dtype is torch.bool):
        runs = key_runs(args[0])
        return unknown if runs is None else [(n, v if v is UNKNOWN else not bool(v)) for n, v in runs]
    if target in _WHERES:
        condition, if_true, if_false = key_runs(args[0]), _constant(args[1]), _constant(args[2])
        if condition is None or if_true is UNKNOWN or if_false is UNKNOWN or _key_length(args[0]) != length:
            return unknown
        return [(n, UNKNOWN if v is UNKNOWN else (if_true if bool(v) else if_false)) for n, v in condition]
    if target in (aten.masked_fill.Scalar, aten.masked_fill.Tensor):
        base, where, fill = key_runs(args[0]), key_runs(args[1]), _constant(args[2])
        if base is None or where is None or fill is UNKNOWN or _key_length(args[1]) != length:
            return unknown
        return [(n, UNKNOWN if w is UNKNOWN or (not w and b is UNKNOWN) else (fill if w else b))
                for n, w, b in _aligned(where, base)]
    return unknown


def _keeps_last_dim(node: torch.fx.Node) -> bool:
    """A view whose last dimension is its input's last dimension (not merged, split or moved)."""
    if node.target is aten.unsqueeze.default:
        rank = meta_value(node).dim()
        return node.args[1] % rank != rank - 1
    source, out = meta_value(node.args[0]), meta_value(node)
    if node.target in (aten.view.default, aten.reshape.default, aten._unsafe_view.default):
        # same number of elements per key position and the key dimension last in both
        return (known_equal(math.prod(source.shape[:-1]), math.prod(out.shape[:-1]))
                and known_equal(source.shape[-1], out.shape[-1]))
    return True  # expand (broadcasts the leading dims), alias, clone


def _constant(node: object) -> object:
    """A value known at compile time: a Python number, or a constant fill (the same everywhere)."""
    if isinstance(node, (int, float, bool)):
        return node
    if isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in _FILLS:
        fill = _FILLS[node.target](node)
        return fill if isinstance(fill, (int, float, bool)) else UNKNOWN
    return UNKNOWN


def _aligned(first: Runs, second: Runs) -> list[tuple[int, object, object]]:
    """Both run lists cut at each other's boundaries: (length, value in first, value in second)."""
    out, i, j, left_i, left_j = [], 0, 0, first[0][0] if first else 0, second[0][0] if second else 0
    while i < len(first) and j < len(second):
        step = min(left_i, left_j)
        if step:
            out.append((step, first[i][1], second[j][1]))
        left_i, left_j = left_i - step, left_j - step
        if not left_i:
            i += 1
            left_i = first[i][0] if i < len(first) else 0
        if not left_j:
            j += 1
            left_j = second[j][0] if j < len(second) else 0
    return out


def _cast(value: object, dtype: torch.dtype) -> object:
    if value is UNKNOWN:
        return UNKNOWN
    if dtype is torch.bool:
        return bool(value)
    return float(value) if dtype.is_floating_point else int(value)  # type: ignore[arg-type]

