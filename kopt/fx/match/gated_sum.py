"""The gated residual add of a DiT block: ``r + gate * y``, matched by shapes.

``gate`` is a per-sample vector, (B, 1, N) or (B, N), and ``r``, ``y`` are shaped like the sum
(B, S, N): the adaLN-Zero form every DiT here uses (FLUX, Qwen-Image, Wan, SD3, ...), whatever
the operand order of the add and the multiply. Shared by ``fuse-gated-residual`` (which fuses it
with the norm after it) and ``residual-fp32`` (which keeps the running sum in float32).

:func:`residual_sum` also takes a plain ``r + y`` of two tensors shaped like the sum (LTX-Video adds
its cross-attention output without a gate), with gate None; only ``fuse-gated-residual`` uses it:
``residual-fp32`` widens gated steps only (see its docstring).
"""

from __future__ import annotations

import torch

from kopt.fx.graph_utils import meta_value
from kopt.fx.symbolic import same_sizes, shape_in

aten = torch.ops.aten


def _add_of_two(add: object) -> str | None:
    """Why ``add`` is not a plain ``aten.add`` of two nodes, or None if it is one."""
    if not (isinstance(add, torch.fx.Node) and add.target is aten.add.Tensor and not add.kwargs
            and len(add.args) == 2):
        return "not an add of two tensors"
    return None


def gated_sum(add: object) -> tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node] | str:
    """``(r, y, gate)`` of ``add = r + gate * y``, or why ``add`` is not one."""
    why_not = _add_of_two(add)
    if why_not is not None:
        return why_not
    out = meta_value(add)
    if out is None or out.dim() < 2:
        return "the sum has no (B, ..., N) shape"
    gates = ((out.shape[0], 1, out.shape[-1]), (out.shape[0], out.shape[-1]))
    for r, product in (add.args, add.args[::-1]):
        if not (isinstance(r, torch.fx.Node) and isinstance(product, torch.fx.Node)
                and product.target is aten.mul.Tensor):
            continue
        residual = meta_value(r)
        a, b = product.args[:2]
        values = meta_value(a), meta_value(b)
        if residual is None or values[0] is None or values[1] is None or not same_sizes(residual.shape, out.shape):
            continue
        if shape_in(values[0].shape, gates) and same_sizes(values[1].shape, out.shape):
            return r, b, a  # type: ignore[return-value]
        if shape_in(values[1].shape, gates) and same_sizes(values[0].shape, out.shape):
            return r, a, b  # type: ignore[return-value]
    return "not r + gate * y with gate (B, 1, N) or (B, N) and r, y shaped like the sum"


def residual_sum(add: object) -> tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node | None] | str:
    """``(r, y, gate)`` of ``add = r + gate * y`` (as :func:`gated_sum`), or ``(r, y, None)`` of a plain
    ``add = r + y`` with ``r`` and ``y`` both shaped like the (B, S, N) sum and of its dtype (``r`` the
    first operand: the sum is the same either way), or why ``add`` is neither."""
    found = gated_sum(add)
    if not isinstance(found, str) or _add_of_two(add) is not None:
        return found
    out = meta_value(add)
    r, y = add.args  # type: ignore[union-attr]
    operands = meta_value(r), meta_value(y)
    if out is None or out.dim() != 3 or any(v is None for v in operands):
        return f"{found}, nor r + y of two (B, S, N) tensors"
    if all(same_sizes(v.shape, out.shape) and v.dtype == out.dtype for v in operands):  # type: ignore[union-attr]
        return r, y, None
    return f"{found}, nor r + y of two tensors shaped like the sum, of its dtype"
