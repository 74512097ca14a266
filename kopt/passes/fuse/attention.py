"""Fuse an attention the model spells out into one kernel: ``kopt::capped_attention``.

    s = bmm(q, kᵀ)                               (B·H, S_q, S_k), viewed as (B, H, S_q, S_k)
    s = s · a …  [tanh(s) · c …]  [+ bias]       scalar factors, at most one tanh, at most one
                                                 additive mask, in this order
    p = softmax(float32?(s), dim=-1) → q.dtype?
    o = bmm(p, v)                                (B·H, S_q, D), viewed as (B, H, S_q, D)
  → o = capped_attention(q, k, v, bias, scale, softcap)

A model spells attention out where torch's fused kernels cannot compute it: Gemma 2's logits are
soft-capped (``cap · tanh(s / cap)``), which no SDPA backend takes, so transformers runs it eagerly
and the (B, H, S_q, S_k) logits go through memory between the two batched GEMMs, the cap, the mask
and the softmax (Inductor fuses the element-wise steps but cannot avoid writing the logits and
reading them back). Matched by what the graph computes, not by a module: the scalar factors
before the tanh and after it are folded — ``c · tanh(a · s)`` is a cap of ``c`` at a scale of
``a · c`` — so any spelling of a scale and a cap matches; without a tanh it is plain attention with
an additive mask. Keys and values repeated for grouped-query attention (``unsqueeze → expand →
clone? → view``, transformers' ``repeat_kv``) are read where they lie, unrepeated.

Valid when every intermediate is read only by the next step (else the logits or probabilities are
needed anyway: ``output_attentions``), the softmax is over the keys, the cap's factor is positive,
and q, k, v share a dtype. Declined with the reason otherwise. Contract: tolerance — the kernel keeps
the logits in float32 where the model rounds them to bf16 after every step (with a cap of 50 that is
up to 0.125 per logit), so it is closer to the float32 model than the model's own bf16 arithmetic.

Not in ``"auto"``: measured at one shape class only (Gemma-2-9B prefill, 2,048 tokens, head dim 256:
6.4 % faster end to end than Inductor's lowering of the spelled-out form, ``dit-full-gemma2-s29e``);
short prompts and other head dims are unmeasured, so the agent's ``add fuse-attention`` choice decides
it per model end to end, and ``passes="auto"`` applies it from the knowledge base where it was kept.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kopt.fx.graph_utils import RESHAPES, meta_value, only_user, replace
from kopt.fx.symbolic import static_int
from kopt.kernels import capped_attention as _registers_the_op  # noqa: F401  (torch.ops.kopt.capped_attention)
from kopt.passes.base import Contract, Pass, PassContext, accepted_matches

aten = torch.ops.aten
RULE = "spelled-attention"
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclasses.dataclass
class Spelled:
    """A matched attention: the operands the fused op takes and the node whose value it replaces."""

    q: torch.fx.Node
    k: torch.fx.Node
    v: torch.fx.Node
    bias: torch.fx.Node | None
    scale: float
    softcap: float | None
    output: torch.fx.Node  # the (B, H, S_q, D) view of the second product, or the product itself
    output_shape: list[int]


def _behind_view(node: object, ndim: int) -> torch.fx.Node | None:
    """The ``ndim``-dimensional value a bmm operand views: back through reshapes to the first value of
    ``ndim`` dims, then through expands that keep its shape (a matmul's broadcast, here a no-op)."""
    while isinstance(node, torch.fx.Node) and (meta_value(node) is None or meta_value(node).dim() != ndim):
        if node.target not in RESHAPES:
            return None
        node = node.args[0]
    while isinstance(node, torch.fx.Node) and node.target is aten.expand.default \
            and meta_value(node.args[0]) is not None and meta_value(node.args[0]).shape == meta_value(node).shape:
        node = node.args[0]
    return node if isinstance(node, torch.fx.Node) else None


def _keys(operand: object) -> torch.fx.Node | None:
    """The (B, H, S_k, D) keys behind the first product's right operand: a 3-D view of the keys
    transposed in their last two dims, or the 3-D view transposed."""
    if isinstance(operand, torch.fx.Node) and operand.target is aten.transpose.int \
            and sorted(a % 3 for a in operand.args[1:]) == [1, 2]:
        return _behind_view(operand.args[0], 4)
    transposed = _behind_view(operand, 4)
    if transposed is None or transposed.target is not aten.transpose.int \
            or sorted(a % 4 for a in transposed.args[1:]) != [2, 3]:
        return None
    return transposed.args[0]


def _scalar(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _is_product_view(node: object) -> bool:
    """A reshape of a batched product: the logits as the first bmm leaves them."""
    return (isinstance(node, torch.fx.Node) and node.target in RESHAPES and isinstance(node.args[0], torch.fx.Node)
            and node.args[0].target is aten.bmm.default)


def _step(node: torch.fx.Node) -> tuple[str, object, object] | None:
    """(kind, value, the logits operand) when ``node`` is one step a spelled-out attention takes on its
    logits: ("scale", factor), ("tanh", None), ("bias", the mask node), ("cast", None); else None."""
    target, args = node.target, node.args
    if target is aten._to_copy.default and set(node.kwargs) <= {"dtype", "layout", "device"}:
        return "cast", None, args[0]
    if target is aten.tanh.default:
        return "tanh", None, args[0]
    if target in (aten.mul.Tensor, aten.div.Tensor) and len(args) == 2 and not node.kwargs:
        first_is_tensor = isinstance(args[0], torch.fx.Node)
        tensor, factor = (args[0], _scalar(args[1])) if first_is_tensor else (args[1], _scalar(args[0]))
        if not isinstance(tensor, torch.fx.Node) or factor is None:
            return None
        if target is aten.div.Tensor and (factor == 0 or not first_is_tensor):
            return None
        return "scale", factor if target is aten.mul.Tensor else 1.0 / factor, tensor
    if target is aten.add.Tensor and len(args) == 2 and node.kwargs.get("alpha", 1) == 1 \
            and all(isinstance(a, torch.fx.Node) for a in args):
        logits = next((a for a in args if _leads_to_product(a)), None)
        if logits is None:
            return None
        return "bias", args[1] if logits is args[0] else args[0], logits
    return None


def _leads_to_product(node: object, depth: int = 8) -> bool:
    """Whether ``node`` is the first product's logits or reaches them through at most ``depth`` steps."""
    for _ in range(depth):
        if _is_product_view(node):
            return True
        found = _step(node) if isinstance(node, torch.fx.Node) and node.target is not aten.add.Tensor else None
        if found is None:
            return False
        node = found[2]
    return False


def _logit_steps(top: torch.fx.Node) -> tuple[torch.fx.Node, list[tuple[str, object]]] | str:
    """(the first product's 4-D view, the steps from it to ``top`` (the softmax's input) in graph
    order), walking back through single-reader steps (:func:`_step`); else why not."""
    steps: list[tuple[str, object]] = []
    node = top
    while not _is_product_view(node):
        if only_user(node) is None:
            return "an intermediate of the logits is read elsewhere (the model needs it: output_attentions?)"
        found = _step(node)
        if found is None:
            return f"a step on the logits that is not a scale, tanh, mask or cast ({node.target})"
        kind, value, node = found
        if kind != "cast":
            steps.append((kind, value))
    return node, steps[::-1]


def _fold(steps: list[tuple[str, object]]) -> tuple[float, float | None, torch.fx.Node | None] | str:
    """(scale, softcap, bias) of steps in graph order: factors before a tanh scale its argument,
    factors after it are the cap; the mask comes last."""
    before, after, tanh, bias = 1.0, 1.0, False, None
    for kind, value in steps:
        if bias is not None:
            return "a step after the mask is added"
        if kind == "scale":
            if tanh:
                after *= value
            else:
                before *= value
        elif kind == "tanh":
            if tanh:
                return "two tanh steps on the logits"
            tanh = True
        else:
            bias = value
    if not tanh:
        return before, None, bias
    if not after > 0:
        return "the factor after the tanh is not positive (not a soft-cap)"
    return before * after, after, bias


def _unrepeated(k: torch.fx.Node, heads: int) -> tuple[torch.fx.Node, int]:
    """(the (B, H / G, S, D) tensor, G) when ``k`` repeats its heads G times (unsqueeze(2) → expand →
    clone? → view), else (k, 1)."""
    node = k
    if node.target not in RESHAPES:
        return k, 1
    node = node.args[0]
    if node.target is aten.clone.default and only_user(node) is not None:
        node = node.args[0]
    if node.target is not aten.expand.default or only_user(node) is None:
        return k, 1
    unsqueezed = node.args[0]
    if unsqueezed.target is not aten.unsqueeze.default or unsqueezed.args[1] != 2 or only_user(unsqueezed) is None:
        return k, 1
    source, expanded = meta_value(unsqueezed.args[0]), meta_value(node)
    if source is None or expanded is None or source.dim() != 4 or expanded.dim() != 5:
        return k, 1
    groups = static_int(expanded.shape[2])
    if groups is None or static_int(source.shape[1]) is None or static_int(source.shape[1]) * groups != heads:
        return k, 1
    return unsqueezed.args[0], groups


def _second_product(softmax: torch.fx.Node) -> tuple[torch.fx.Node | None, bool]:
    """(the bmm taking the probabilities as its left operand, through casts, reshapes and same-shape
    expands; whether each node on the way has that one reader), or (None, False)."""
    node, sole = softmax, True
    for _ in range(4):
        readers = list(node.users)
        sole = sole and len(readers) == 1
        nxt = next((r for r in readers if r.target is aten.bmm.default and r.args[0] is node), None)
        if nxt is not None:
            return nxt, sole
        nxt = next((r for r in readers if r.target in RESHAPES or r.target is aten._to_copy.default
                    or (r.target is aten.expand.default and meta_value(r) is not None
                        and meta_value(r).shape == meta_value(node).shape)), None)
        if nxt is None:
            return None, False
        node = nxt
    return None, False


def match(softmax: torch.fx.Node) -> Spelled | str | None:
    """The fused op's operands for the attention around ``softmax``, else why not (None: a softmax that
    is not between two batched products)."""
    second, sole = _second_product(softmax)
    if second is None:
        return None  # not a softmax between two batched products
    if not sole:
        return "the probabilities are read elsewhere too (output_attentions?)"
    if not isinstance(softmax.args[0], torch.fx.Node):
        return "the softmax's input is not computed in the graph"
    found = _logit_steps(softmax.args[0])
    if isinstance(found, str):
        return found
    raw, steps = found
    first = raw.args[0]
    folded = _fold(steps)
    if isinstance(folded, str):
        return folded
    scale, softcap, bias = folded
    value = meta_value(softmax)
    if value is None or softmax.args[1] not in (-1, value.dim() - 1) or value.dim() != 4:
        return "not a softmax over the last dim of (B, H, S_q, S_k) logits"
    if only_user(first) is None or only_user(raw) is None:
        return "the first product is read elsewhere"
    q = _behind_view(first.args[0], 4)
    k = _keys(first.args[1])
    v = _behind_view(second.args[1], 4)
    if q is None or k is None or v is None:
        return "an operand of the products is not a view of (B, H, S, D) values (the keys transposed)"
    qv, kv, vv = meta_value(q), meta_value(k), meta_value(v)
    if any(t is None for t in (qv, kv, vv)) or not (qv.shape[:2] == kv.shape[:2] == vv.shape[:2]):
        return "queries, keys and values do not share batch and heads"
    if qv.dtype not in _DTYPES or kv.dtype != qv.dtype or vv.dtype != qv.dtype:
        return f"q, k, v dtypes {qv.dtype}, {kv.dtype}, {vv.dtype} are not one of {_DTYPES}"
    if qv.shape[3] != kv.shape[3] or kv.shape[2] != vv.shape[2]:
        return "keys and values do not match the queries' head dim and each other's length"
    if bias is not None:
        bias_value = meta_value(bias)
        if bias_value is None or not bias_value.dtype.is_floating_point or bias_value.dim() > 4:
            return "the mask is not a float tensor of at most 4 dims"
    shape = [static_int(size) for size in (*qv.shape[:3], vv.shape[3])]
    if None in shape:
        return "a dynamic size: the output's shape cannot be written as a view"
    out_view = next(iter(second.users)) if len(second.users) == 1 else None
    output = out_view if out_view is not None and out_view.target in RESHAPES and \
        list(meta_value(out_view).shape) == shape else second
    heads = static_int(qv.shape[1])
    k_source, k_groups = _unrepeated(k, heads)
    v_source, v_groups = _unrepeated(v, heads)
    if k_groups != v_groups:
        k_source, v_source = k, v
    if not math.isfinite(scale):
        return "the logits' scale is not finite"
    return Spelled(q, k_source, v_source, bias, scale, softcap, output, shape)


class FuseAttention(Pass):
    name = "fuse-attention"
    why = ("an attention spelled out as two batched GEMMs around a softmax (soft-capped logits, a mask) runs "
           "as one kernel that never writes the logits")
    contract = Contract.tolerance(1e-2)
    # Early, on the graph as captured: codegen-fuse (opt-in, before staging) would otherwise take the
    # element-wise steps between the two products into a generated kernel of its own.
    runs_before = "sibling-merge"

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        for _softmax, found in accepted_matches(graph, aten._softmax.default, match, ctx, RULE):
            with graph.inserting_before(found.output):
                fused = graph.call_function(torch.ops.kopt.capped_attention.default,
                                            (found.q, found.k, found.v, found.bias, found.scale, found.softcap))
                out = fused if found.output.target in RESHAPES else graph.call_function(  # the 3-D product
                    aten.reshape.default, (fused, [found.output_shape[0] * found.output_shape[1],
                                                   *found.output_shape[2:]]))  # a copy: heads are not outermost
            replace(found.output, out, pass_name=self.name, rule=RULE)
        graph.eliminate_dead_code()
