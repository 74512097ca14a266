"""Fuse adaLN modulation: ``norm(x) * (1 + scale) + shift`` becomes one ``kopt::adaln_modulation``.

    y = native_layer_norm(x, [N], None, None, eps)[0]      (rule adaln-modulation)
    y = x * rsqrt(mean(x**2, -1) + eps)  in any spelling   (rule adaln-modulation-rms: LTX-Video)
    out = (y * (scale + 1)) + shift          (either operand order of * and +)
  → out = kopt.adaln_modulation(x, scale, shift, None, eps, rms)

Valid when the norm has no affine parameters and normalizes the last dimension of a (B, S, N)
input, scale and shift broadcast as (B, 1, N) or (B, N), the output has ``x``'s dtype, and nothing
else reads the normalized value (nor, for the LayerNorm, its mean or rstd). The RMSNorm is
recognised by :func:`kopt.fx.match.rms_norm.rms_norm` (diffusers' and torch's spellings, casts
between its ops). Contract: tolerance — the kernel rounds once, after modulating, where the
unfused bf16 graph rounds the normalized value first (≤ 1 ulp of the output dtype).
"""

from __future__ import annotations

import operator

import torch

from kopt.fx.binding_time import is_view
from kopt.fx.graph_utils import meta_value, only_user, replace
from kopt.fx.match.rms_norm import rms_norm
from kopt.fx.symbolic import known_equal, same_sizes, shape_in
from kopt.kernels import adaln_modulation as _registers_the_op  # noqa: F401  (torch.ops.kopt.adaln_modulation)
from kopt.passes.base import Contract, Pass, PassContext, accepted_matches

aten = torch.ops.aten
RULE = "adaln-modulation"
RMS_RULE = "adaln-modulation-rms"
_ORDER_KEEPING_VIEWS = {aten.unsqueeze.default, aten.slice.Tensor, aten.view.default, aten._unsafe_view.default}


def _other(node: torch.fx.Node, known: torch.fx.Node) -> object:
    a, b = node.args[:2]
    return b if a is known else a


def _plus_one_operand(node: object) -> torch.fx.Node | None:
    """``s`` if ``node`` is ``s + 1`` or ``1 + s``, possibly seen through views that keep its
    element order (``(1 + scale)[:, None, :]`` of a (B, N) scale): the op takes either shape."""
    while isinstance(node, torch.fx.Node) and is_view(node) and node.target is not operator.getitem:
        source = node.args[0]
        same_count = (isinstance(source, torch.fx.Node) and "val" in source.meta and "val" in node.meta
                      and known_equal(source.meta["val"].numel(), node.meta["val"].numel()))
        if not same_count or node.target not in _ORDER_KEEPING_VIEWS:
            return None
        node = source
    if not isinstance(node, torch.fx.Node) or node.target is not aten.add.Tensor or node.kwargs:
        return None
    a, b = node.args[:2]
    if b == 1 and isinstance(a, torch.fx.Node):
        return a
    if a == 1 and isinstance(b, torch.fx.Node):
        return b
    return None


def _modulation_shape_ok(value: object, batch: object, width: object) -> bool:
    shape = tuple(getattr(value, "shape", ()))
    return shape_in(shape, ((batch, 1, width), (batch, width), (1, width) if known_equal(batch, 1) else ()))


def match(norm: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node, float] | str:
    """(x, scale, shift, eps) for an adaLN region rooted at ``norm``, or why it is not one."""
    x, normalized_shape, weight, bias, eps = norm.args
    x_val = x.meta.get("val")
    if weight is not None or bias is not None:
        return "layer norm has affine parameters"
    if x_val is None or x_val.dim() != 3 or not same_sizes(list(normalized_shape), [x_val.shape[-1]]):
        return "not a last-dimension norm of a (B, S, N) tensor"
    if not isinstance(eps, (int, float)):
        return "eps is not a number known at compile time"
    getters = [g for g in norm.users if g.users]  # unused getitems are dead code, not readers
    if len(getters) != 1 or getters[0].target is not operator.getitem or getters[0].args[1] != 0:
        return "mean or rstd of the norm is used elsewhere"
    normed = getters[0]
    product = only_user(normed)
    if product is None or product.target is not aten.mul.Tensor:
        return "the normalized value is not only multiplied"
    scale = _plus_one_operand(_other(product, normed))
    if scale is None:
        return "the multiplier is not (1 + scale)"
    total = only_user(product)
    if total is None or total.target is not aten.add.Tensor or total.kwargs:
        return "no shift is added after the scale"
    shift = _other(total, product)
    batch, width = x_val.shape[0], x_val.shape[-1]
    if not isinstance(shift, torch.fx.Node) or not all(
            _modulation_shape_ok(v.meta.get("val"), batch, width) for v in (scale, shift)):
        return "scale/shift are not per-sample (B, 1, N) vectors"
    return x, scale, shift, float(eps)


def match_rms(product: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node, torch.fx.Node, float] | str | None:
    """(x, scale, shift, eps) for ``rms_norm(x) * (1 + scale) + shift`` rooted at the multiply, a
    reason when the multiply is by ``1 + scale`` but the rest does not fit, or None (no candidate)."""
    for normed, factor in ((product.args[0], product.args[1]), (product.args[1], product.args[0])):
        scale = _plus_one_operand(factor)
        if scale is None or not isinstance(normed, torch.fx.Node):
            continue
        found = rms_norm(normed)
        if isinstance(found, str):
            continue  # a (1 + scale) product of something else: LayerNorm forms are the other rule's
        x, weight, eps = found
        x_val, out_val = meta_value(x), None
        if weight is not None:
            return "the RMSNorm has a weight"
        if x_val is None or x_val.dim() != 3:
            return "not a last-dimension RMSNorm of a (B, S, N) tensor"
        if only_user(normed) is not product:
            return "the normalized value is read elsewhere too"
        total = only_user(product)
        if total is None or total.target is not aten.add.Tensor or total.kwargs:
            return "no shift is added after the scale"
        shift = _other(total, product)
        out_val = meta_value(total)
        batch, width = x_val.shape[0], x_val.shape[-1]
        if not isinstance(shift, torch.fx.Node) or not all(
                _modulation_shape_ok(v.meta.get("val"), batch, width) for v in (scale, shift)):
            return "scale/shift are not per-sample (B, 1, N) vectors"
        if out_val is None or out_val.dtype != x_val.dtype or tuple(out_val.shape) != tuple(x_val.shape):
            return "the modulated value does not have the input's dtype and shape"
        return x, scale, shift, eps
    return None


class FuseAdaLN(Pass):
    name = "fuse-adaln"
    why = "norm and modulation read and write the activation once, in one kernel"
    contract = Contract.tolerance(1e-2)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        for norm, (x, scale, shift, eps) in accepted_matches(graph, aten.native_layer_norm.default, match, ctx, RULE):
            normed = next(g for g in norm.users if g.users)
            total = next(iter(next(iter(normed.users)).users))
            with graph.inserting_before(total):
                fused = graph.call_function(torch.ops.kopt.adaln_modulation.default,
                                            (x, scale, shift, None, eps, False))
            replace(total, fused, pass_name=self.name, rule=RULE)
        for product, (x, scale, shift, eps) in accepted_matches(graph, aten.mul.Tensor, match_rms, ctx, RMS_RULE):
            total = next(iter(product.users))
            with graph.inserting_before(total):
                fused = graph.call_function(torch.ops.kopt.adaln_modulation.default,
                                            (x, scale, shift, None, eps, True))
            replace(total, fused, pass_name=self.name, rule=RMS_RULE)
        graph.eliminate_dead_code()
