"""Fuse QK RMSNorm + complex RoPE (Qwen-Image's form) into one ``kopt::qk_norm_rope``.

    n = x * rsqrt(mean(x², -1) + eps) [* weight]                 (RMSNorm over the head dim)
    out = view_as_real(view_as_complex(n.view(B, S, H, D/2, 2)) * freqs[:, None]).view(B, S, H, D)
  → out = kopt.qk_norm_rope(x, weight, freqs.real, freqs.imag, eps, "complex")

Inductor cannot generate code for complex arithmetic, so unfused this region runs as several
ATen kernels each moving the whole Q or K tensor; fused it is one read and one write, with the
cos/sin tables read as strided views of ``freqs`` (no copy). Casts between the ops (bf16 models
norm in float32 and cast back) do not hide the match. Valid when ``freqs`` is a complex (S, D/2)
table broadcast over batch and heads and the result is cast back to the input's dtype.
Contract: tolerance — the kernel keeps float32 from the norm through the rotation and rounds once.
"""

from __future__ import annotations

import torch

from kopt.fx.graph_utils import meta_value, only_user, replace
from kopt.fx.match.rms_norm import is_cast, rms_norm
from kopt.fx.symbolic import same_sizes
from kopt.kernels import qk_norm_rope as _registers_the_op  # noqa: F401  (torch.ops.kopt.qk_norm_rope)
from kopt.passes.base import Contract, Pass, PassContext, accepted_matches

aten = torch.ops.aten
RULE = "qk-norm-rope"


def match(complex_view: torch.fx.Node) -> tuple[torch.fx.Node, ...] | str:
    """(x, weight, eps, freqs, result) for the region around ``complex_view``, or why not."""
    pairs = complex_view.args[0]
    product = only_user(complex_view, aten.mul.Tensor)
    if product is None or not isinstance(pairs, torch.fx.Node) or pairs.target is not aten.view.default:
        return "view_as_complex is not of a (..., D/2, 2) view followed by one multiply"
    broadcast = product.args[1] if product.args[0] is complex_view else product.args[0]
    if not (isinstance(broadcast, torch.fx.Node) and broadcast.target is aten.unsqueeze.default
            and broadcast.args[1] == 1):
        return "the rotation is not freqs[:, None] broadcast over heads"
    freqs = broadcast.args[0]
    real = only_user(product, aten.view_as_real.default)
    flat = only_user(real, aten.view.default) if real is not None else None
    if flat is None:
        return "the product is not viewed back to real (B, S, H, D)"
    result = flat
    cast = list(flat.users)
    if len(cast) == 1 and is_cast(cast[0]):
        result = cast[0]
    norm = rms_norm(pairs.args[0])
    if isinstance(norm, str):
        return norm
    x, weight, eps = norm
    x_val, freqs_val, result_val = meta_value(x), meta_value(freqs), meta_value(result)
    if x_val is None or x_val.dim() != 4 or freqs_val is None or not freqs_val.is_complex():
        return "x is not (B, S, H, D) or the table is not complex"
    if not same_sizes(freqs_val.shape, (x_val.shape[1], x_val.shape[3] // 2)):
        return f"table shape {tuple(freqs_val.shape)} is not (S, D/2)"
    if result_val is None or result_val.dtype != x_val.dtype or not same_sizes(result_val.shape, x_val.shape):
        return "the result is not cast back to the input's dtype and shape"
    return x, weight, eps, freqs, result


class FuseQKNormRope(Pass):
    name = "fuse-qk-norm-rope"
    why = "RMSNorm and the complex rotary embedding of Q and K in one pass (Inductor cannot fuse complex ops)"
    contract = Contract.tolerance(1e-2)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        for _, (x, weight, eps, freqs, result) in accepted_matches(graph, aten.view_as_complex.default, match,
                                                                   ctx, RULE):
            with graph.inserting_before(result):
                table = graph.call_function(aten.view_as_real.default, (freqs,))
                cos = graph.call_function(aten.select.int, (table, -1, 0))
                sin = graph.call_function(aten.select.int, (table, -1, 1))
                fused = graph.call_function(torch.ops.kopt.qk_norm_rope.default,
                                            (x, weight, cos, sin, eps, "complex"))
            replace(result, fused, pass_name=self.name, rule=RULE)
        graph.eliminate_dead_code()
