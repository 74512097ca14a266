"""Recognise an RMSNorm over the last dimension in a functional ATen graph, whatever wrote it.

The same math reaches the graph in several spellings, and a matcher that knows only one of them
silently stops firing on another model or another device:

* diffusers' ``RMSNorm``: ``x * rsqrt(mean(x.float() ** 2, -1, keepdim=True) + eps)``, the weight
  multiplied after a cast back to the input dtype;
* ``torch.nn.RMSNorm`` decomposed (the CPU trace): the same with ``mean(..., [ndim - 1])``,
  ``add_.Scalar`` for the epsilon and the weight multiplied in float32 before the cast;
* ``torch.nn.RMSNorm`` kept whole (the CUDA trace): ``aten._fused_rms_norm(x, [D], weight, eps)[0]``,
  where ``eps=None`` means ``torch.finfo(x.dtype).eps``.

Casts between the ops are transparent: they are dtype-only ``_to_copy`` nodes on the same device,
and the fused kernels that replace a norm compute in float32 and round once (a tolerance
contract, stated by each pass that uses this matcher).
"""

from __future__ import annotations

import operator

import torch

from kopt.fx.constants import constant_value
from kopt.fx.graph_utils import meta_value
from kopt.fx.symbolic import same_sizes

aten = torch.ops.aten
_EPSILON_ADDS = (aten.add.Tensor, aten.add.Scalar, aten.add_.Scalar, aten.add_.Tensor)


def is_cast(node: object) -> bool:
    """A ``_to_copy`` that changes at most the dtype (``.float()``, ``.to(dtype)``, ``type_as``)."""
    if not (isinstance(node, torch.fx.Node) and node.target is aten._to_copy.default):
        return False
    if not set(node.kwargs) <= {"dtype", "layout", "device"}:
        return False
    if node.kwargs.get("layout", torch.strided) != torch.strided:
        return False
    source, result = meta_value(node.args[0]), meta_value(node)
    return source is not None and result is not None and source.device == result.device


def through_casts(node: object) -> object:
    """The value behind a chain of dtype-only casts."""
    while is_cast(node):
        node = node.args[0]  # type: ignore[union-attr]
    return node


def _is_last_dim(dims: object, ndim: int) -> bool:
    return isinstance(dims, (list, tuple)) and len(dims) == 1 and dims[0] in (-1, ndim - 1)


def _fused_rms_norm(node: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node | None, float] | str:
    """``aten._fused_rms_norm(x, [D], weight, eps)[0]``."""
    fused = node.args[0]
    if node.args[1] != 0 or not (isinstance(fused, torch.fx.Node) and fused.target is aten._fused_rms_norm.default):
        return "not output 0 of aten._fused_rms_norm"
    x, normalized_shape = fused.args[:2]
    weight = fused.args[2] if len(fused.args) > 2 else fused.kwargs.get("weight")
    eps = fused.args[3] if len(fused.args) > 3 else fused.kwargs.get("eps")
    x_val = meta_value(x)
    if x_val is None or not same_sizes(list(normalized_shape), [x_val.shape[-1]]):
        return "aten._fused_rms_norm over more than the last dimension"
    if weight is not None and (constant_value(weight) is None or constant_value(weight).dim() != 1):
        return "aten._fused_rms_norm weight is not a constant vector"
    if eps is None:
        eps = torch.finfo(x_val.dtype).eps
    if not isinstance(eps, (int, float)):
        return "aten._fused_rms_norm eps is not a number known at compile time"
    return x, weight, float(eps)  # type: ignore[return-value]


def rms_norm(node: object) -> tuple[torch.fx.Node, torch.fx.Node | None, float] | str:
    """(x, weight or None, eps) if ``node`` computes an RMSNorm of ``x`` over its last dim, else why not."""
    node = through_casts(node)
    if isinstance(node, torch.fx.Node) and node.target is operator.getitem:
        return _fused_rms_norm(node)
    weight = None
    if isinstance(node, torch.fx.Node) and node.target is aten.mul.Tensor:
        a, b = node.args[:2]
        for candidate, other in ((b, a), (a, b)):
            value = constant_value(candidate)
            if value is not None and value.dim() == 1:
                weight, node = candidate, through_casts(other)
                break
    if not (isinstance(node, torch.fx.Node) and node.target is aten.mul.Tensor):
        return "the value is not an RMSNorm output"
    xs, rstd = node.args[:2]
    if not (isinstance(rstd, torch.fx.Node) and rstd.target is aten.rsqrt.default):
        xs, rstd = rstd, xs
    if not (isinstance(rstd, torch.fx.Node) and rstd.target is aten.rsqrt.default):
        return "no rsqrt: the value is not an RMSNorm output"
    total = rstd.args[0]
    if not (isinstance(total, torch.fx.Node) and total.target in _EPSILON_ADDS
            and isinstance(total.args[1], (float, int)) and not isinstance(total.args[1], bool)):
        return "rsqrt of something other than mean + eps"
    mean = total.args[0]
    mean_val = meta_value(mean)
    if not (isinstance(mean, torch.fx.Node) and mean.target is aten.mean.dim and mean_val is not None
            and _is_last_dim(mean.args[1], mean_val.dim())):
        return "not a mean over the last dimension"
    square = mean.args[0]
    if not (isinstance(square, torch.fx.Node) and square.target is aten.pow.Tensor_Scalar and square.args[1] == 2):
        return "not a mean of squares"
    if through_casts(square.args[0]) is not through_casts(xs):
        return "the norm's statistics and its scaled value come from different tensors"
    return through_casts(xs), weight, float(total.args[1])  # type: ignore[return-value]
