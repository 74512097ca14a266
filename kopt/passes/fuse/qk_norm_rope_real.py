"""Fuse QK RMSNorm + real-form RoPE (FLUX.2's form) into one kopt op, joint streams included.

    n   = RMSNorm(x)                                            (over the head dim, any spelling)
    a, b = n.view(B, S, H, D/2, 2).unbind(-1)
    out = n * cos[None, :, None] + stack([-b, a], -1).view(B, S, H, D) * sin[None, :, None]
  → out = kopt.qk_norm_rope(x, weight, cos, sin, eps, "real")

and, when ``n = cat([RMSNorm_1(x_1), RMSNorm_2(x_2), ...], dim=1)`` (a double-stream block rotates
the concatenated text + image Q after normalizing each stream with its own weights),

  → out = kopt.qk_norm_rope_joint([x_1, x_2, ...], [w_1, w_2, ...], [cos[0:S_1], cos[S_1:], ...], ...)

which writes every stream's rows straight into the joint attention buffer (no concatenation).

With the heads still flattened (LTX-Video's form: ``n`` is (B, S, H*D), normalized across heads,
``cos``/``sin`` are (1, S, H*D) tables and the pairs are ``n.unflatten(2, (-1, 2))``), the region is
the same computation with one head of width H*D: x is viewed as (B, S, 1, H*D) for the kernel.

Why it is valid: ``cos``/``sin`` are (S, D) tables broadcast over batch and heads (checked on the
shapes), the rotation pairs interleaved elements exactly as the kernel's ``mode="real"`` (checked
on the graph: unbind of the last dim of a (..., D/2, 2) view, stacked as (-odd, even)), and the
result is cast back to the input dtype. Contract: tolerance, since the kernel keeps float32 from
the norm through the rotation and rounds once, where the unfused graph rounds the norm output.
"""

from __future__ import annotations

import operator

import torch

from kopt.fx.graph_utils import RESHAPES, add_sizes, meta_value, only_user, replace, size_arg
from kopt.fx.match.rms_norm import is_cast, rms_norm, through_casts
from kopt.fx.symbolic import known_equal, same_sizes
from kopt.kernels import joint_qk_norm_rope as _registers_joint  # noqa: F401  (torch.ops.kopt.qk_norm_rope_joint)
from kopt.kernels import qk_norm_rope as _registers_the_op  # noqa: F401  (torch.ops.kopt.qk_norm_rope)
from kopt.passes.base import Contract, Pass, PassContext, accepted_matches

aten = torch.ops.aten
RULE = "qk-norm-rope-real"
JOINT_RULE = "joint-qk-norm-rope-real"


def _is_last(dim: object, ndim: int) -> bool:
    return dim in (-1, ndim - 1)


def _rotated_source(stack: torch.fx.Node) -> torch.fx.Node | str:
    """n if ``stack`` is ``stack([-b, a], -1)`` of ``a, b = n.view(..., D/2, 2).unbind(-1)``."""
    parts = stack.args[0]
    stack_val = meta_value(stack)
    if stack_val is None or not _is_last(stack.args[1] if len(stack.args) > 1 else 0, stack_val.dim()):
        return "stack is not over a new last dimension"
    if not (isinstance(parts, (list, tuple)) and len(parts) == 2):
        return "stack of other than two halves"
    negated, even = parts
    if not (isinstance(negated, torch.fx.Node) and negated.target is aten.neg.default):
        return "the first stacked half is not negated: not the (-odd, even) rotation"
    odd = negated.args[0]
    for item, index in ((even, 0), (odd, 1)):
        if not (isinstance(item, torch.fx.Node) and item.target is operator.getitem and item.args[1] == index):
            return "the halves are not elements 0 and 1 of one unbind"
    unbind = even.args[0]
    if unbind is not odd.args[0] or unbind.target is not aten.unbind.int:
        return "the halves are not elements 0 and 1 of one unbind"
    pairs = unbind.args[0]
    pairs_val = meta_value(pairs)
    if not (isinstance(pairs, torch.fx.Node) and pairs.target in RESHAPES and pairs_val is not None
            and _is_last(unbind.args[1] if len(unbind.args) > 1 else 0, pairs_val.dim())
            and known_equal(pairs_val.shape[-1], 2)):
        return "unbind is not of a (..., D/2, 2) view of the normalized value"
    return pairs.args[0]


def _table(broadcast: object, s: object, d: int, flat: bool) -> torch.fx.Node | str:
    """The (S, D) (or (1, S, D)) table behind ``table[None, :, None, :]`` (a chain of unsqueezes;
    ``[None]`` or nothing when the heads are ``flat``), or why not. Sizes are compared without adding
    guards (:func:`~kopt.fx.symbolic.same_sizes`)."""
    node = broadcast
    while isinstance(node, torch.fx.Node) and node.target is aten.unsqueeze.default:
        node = node.args[0]
    value = meta_value(node)
    if value is None or not (same_sizes(value.shape, (s, d)) or same_sizes(value.shape, (1, s, d))):
        return f"the table is not an (S, D) = ({s}, {d}) tensor broadcast over batch and heads"
    broadcast_shape = meta_value(broadcast).shape
    shapes = ((1, s, d), (s, d)) if flat else ((1, s, 1, d), (s, 1, d))
    if not any(same_sizes(broadcast_shape, shape) for shape in shapes):
        return "the table is not broadcast over batch and heads alone"
    return node  # type: ignore[return-value]


def _product_with(node: object, source: object) -> tuple[torch.fx.Node, object] | None:
    """(the mul, the other factor) if ``node`` is ``mul(cast?(source), other)`` in either order."""
    if not (isinstance(node, torch.fx.Node) and node.target is aten.mul.Tensor):
        return None
    a, b = node.args[:2]
    source = through_casts(source)
    if through_casts(a) is source:
        return node, b
    if through_casts(b) is source:
        return node, a
    return None


def match(stack: torch.fx.Node) -> tuple | str:
    """(segments, cos, sin, result) for the region around ``stack``, or why not.

    segments: [(x, weight, eps, S)], one for a single stream, several for joint streams."""
    n = _rotated_source(stack)
    if isinstance(n, str):
        return n
    n_val = meta_value(n)
    if n_val is None or n_val.dim() not in (3, 4):
        return "the rotated value is neither (B, S, H, D) nor (B, S, H*D)"
    flat = n_val.dim() == 3
    s, d = n_val.shape[1], n_val.shape[-1]
    rotated = only_user(stack)
    if rotated is None or rotated.target not in RESHAPES or not same_sizes(meta_value(rotated).shape, n_val.shape):
        return "the stacked halves are not viewed back to the rotated value's shape"
    rotated_cast = only_user(rotated)
    while rotated_cast is not None and is_cast(rotated_cast):
        rotated, rotated_cast = rotated_cast, only_user(rotated_cast)
    found = _product_with(rotated_cast, rotated)
    if found is None:
        return "the rotated value is not multiplied by a table"
    sin_product, sin_b = found
    total = only_user(sin_product, aten.add.Tensor)
    if total is None:
        return "rotated * sin is not added to anything"
    other = total.args[0] if total.args[1] is sin_product else total.args[1]
    found = _product_with(other, n)
    if found is None:
        return "the sum is not n * cos + rotate(n) * sin"
    _, cos_b = found
    cos, sin = _table(cos_b, s, d, flat), _table(sin_b, s, d, flat)
    if isinstance(cos, str) or isinstance(sin, str):
        return cos if isinstance(cos, str) else sin  # type: ignore[return-value]
    result = total
    users = list(total.users)
    if len(users) == 1 and is_cast(users[0]):
        result = users[0]
    segments = _segments(n)
    if isinstance(segments, str):
        return segments
    if flat and len(segments) > 1:
        return "joint streams with their heads flattened (no kernel writes those)"
    result_val = meta_value(result)
    if (result_val is None or result_val.dtype != meta_value(segments[0][0]).dtype
            or not same_sizes(result_val.shape, n_val.shape)):
        return "the result is not cast back to the input's dtype and shape"
    return segments, cos, sin, result


def _segments(n: torch.fx.Node) -> list[tuple[torch.fx.Node, torch.fx.Node | None, float]] | str:
    """[(x, weight, eps)] if n is one RMSNorm or a sequence-dim cat of RMSNorms, else why not."""
    single = rms_norm(n)
    if not isinstance(single, str):
        return [single]
    joint = through_casts(n)
    if not (isinstance(joint, torch.fx.Node) and joint.target is aten.cat.default):
        return single
    dim = joint.args[1] if len(joint.args) > 1 else 0
    if dim not in (1, -3):
        return "a cat of the streams along other than the sequence dim"
    segments = []
    for part in joint.args[0]:
        norm = rms_norm(part)
        if isinstance(norm, str):
            return f"a joint stream is not normalized: {norm}"
        segments.append(norm)
    dtypes = {meta_value(x).dtype for x, *_ in segments}
    if len(dtypes) != 1:
        return f"the streams have different dtypes {sorted(map(str, dtypes))}"
    return segments


def _float_table(graph: torch.fx.Graph, table: torch.fx.Node) -> torch.fx.Node:
    """The table as a float32 (S, D) tensor (the kernel's table dtype; the unfused graph promotes to it
    anyway)."""
    value = meta_value(table)
    if value.dim() == 3:  # (1, S, D): checked by the match
        table = graph.call_function(aten.squeeze.dim, (table, 0))
    if value.dtype == torch.float32:
        return table
    return graph.call_function(aten._to_copy.default, (table,), {"dtype": torch.float32})


class FuseQKNormRopeReal(Pass):
    name = "fuse-qk-norm-rope-real"
    why = ("RMSNorm and the real-form rotary embedding of Q and K in one pass, joint streams written straight "
           "into the attention buffer")
    contract = Contract.tolerance(1e-2)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        def rule_of(found: tuple) -> str:
            return JOINT_RULE if len(found[0]) > 1 else RULE

        for _, (segments, cos, sin, result) in accepted_matches(graph, aten.stack.default, match, ctx, RULE,
                                                                rule_of=rule_of):
            rule = rule_of((segments,))
            with graph.inserting_before(result):
                cos32, sin32 = _float_table(graph, cos), _float_table(graph, sin)
                if len(segments) == 1:
                    x, weight, eps = segments[0]
                    flat = meta_value(x).dim() == 3  # heads flattened: one head of width H*D
                    heads = graph.call_function(aten.unsqueeze.default, (x, 2)) if flat else x
                    fused = graph.call_function(torch.ops.kopt.qk_norm_rope.default,
                                                (heads, weight, cos32, sin32, eps, "real"))
                    if flat:
                        fused = graph.call_function(aten.squeeze.dim, (fused, 2))
                else:
                    coses, sines, offset = [], [], 0
                    for x, *_ in segments:  # each stream's rows of the table; sizes may be symbolic
                        end = add_sizes(graph, offset, size_arg(graph, x, 1))
                        coses.append(graph.call_function(aten.slice.Tensor, (cos32, 0, offset, end)))
                        sines.append(graph.call_function(aten.slice.Tensor, (sin32, 0, offset, end)))
                        offset = end
                    fused = graph.call_function(
                        torch.ops.kopt.qk_norm_rope_joint.default,
                        ([x for x, *_ in segments], [w for _, w, _ in segments], coses, sines,
                         [e for _, _, e in segments], "real"))
            replace(result, fused, pass_name=self.name, rule=rule)
        graph.eliminate_dead_code()

