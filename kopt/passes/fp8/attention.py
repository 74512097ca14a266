"""FP8 attention: a non-causal scaled-dot-product attention becomes one ``kopt::fp8_attention``.

    out = sdpa(q, k, v, attn_mask=bias, scale=s)[0]          (any of aten's SDPA variants)
  → out = kopt.fp8_attention(q, k, v, bias.reshape(B, S_k), s)

The kernel (:mod:`kopt.kernels.fp8_attention`) quantizes Q and K per row and V per key tile to
FP8 and runs both products on FP8 tensor cores, twice bf16's peak rate. Valid for attention
without dropout or causal masking, Q/K/V of one (B, H) layout with a head dim the kernel
supports, and a mask that is absent or an additive float key mask (B or 1, 1, 1, S_k), the form
Qwen-Image's text padding takes; only the output is read (not the log-sum-exp). Values that are a
concatenation of two parts read by nothing else (a joint attention's text and image values) are
passed as both parts, so the kernel's K/V quantization reads them where they are. Where the graph
shows the mask to be zero outside a window of keys (Qwen-Image: everything but the text keys,
:mod:`kopt.fx.match.key_mask_window`), the op gets that window and skips the mask there. The loss is FP8
rounding, so the contract is ``quality``: the gate of :class:`kopt.fp8.Fp8Config`. Opt-in with
``Fp8Config(attention=True)``.
"""

from __future__ import annotations

import operator

import torch
from torch.fx.operator_schemas import normalize_function

from kopt.fp8.config import Fp8Config
from kopt.fx.graph_utils import calls, meta_value, replace, size_arg, stamp, swaps_dims_1_and_2
from kopt.fx.match.key_mask_window import bias_window
from kopt.fx.symbolic import fake_mode_for, known_equal, same_sizes, static_int
from kopt.kernels import fp8_attention as kernel
from kopt.passes.base import PassContext, accepted_matches
from kopt.passes.fp8.base import Fp8Pass

aten = torch.ops.aten
RULE = "fp8-attention"
# SDPA forms a capture produces: the public op and the backend-specific ones (CPU, flash, cuDNN, mem-efficient)
TARGETS = (aten.scaled_dot_product_attention.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
           aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_cudnn_attention.default,
           aten._scaled_dot_product_efficient_attention.default)


def _arguments(node: torch.fx.Node) -> dict[str, object]:
    normalized = normalize_function(node.target, tuple(node.args), dict(node.kwargs),
                                    normalize_to_only_use_kwargs=True)
    return dict(normalized.kwargs) if normalized is not None else {}


def match(node: torch.fx.Node) -> tuple[torch.fx.Node, ...] | str | None:
    """(q, k, v, mask or None, the softmax scale as a node-free value) or why the attention is declined."""
    params = _arguments(node)
    if not params:
        return "could not read the attention's arguments"
    if params.get("dropout_p", 0.0):
        return "attention with dropout"
    if params.get("is_causal", False):
        return "causal attention (the FP8 kernel is non-causal)"
    if params.get("enable_gqa", False):
        return "grouped-query attention"
    q, k, v = (meta_value(params[name]) for name in ("query", "key", "value"))
    if q is None or k is None or v is None or q.dim() != 4 or not same_sizes(k.shape, v.shape) \
            or not same_sizes(q.shape[:2], k.shape[:2]) or not known_equal(q.shape[3], k.shape[3]):
        return "not (B, H, S, D) q, k, v with equal B, H, D"
    if static_int(q.shape[3]) not in kernel.HEAD_DIMS:
        return f"head dim {q.shape[3]} (the kernel takes {list(kernel.HEAD_DIMS)})"
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"{q.dtype} attention"
    mask = params.get("attn_mask", params.get("attn_bias"))
    if mask is not None:
        value = meta_value(mask)
        if value is None or not value.is_floating_point():
            return "a boolean mask (the kernel takes an additive float key mask)"
        if value.dim() != 4 or not same_sizes(value.shape[1:], (1, 1, k.shape[2])) \
                or not (known_equal(value.shape[0], 1) or known_equal(value.shape[0], q.shape[0])):
            return f"a {tuple(value.shape)} mask: only key masks (B or 1, 1, 1, S_k) are supported"
    if node.target is not aten.scaled_dot_product_attention.default:
        if any(user.target is not operator.getitem or (user.args[1] != 0 and user.users) for user in node.users):
            return "the log-sum-exp (or another secondary output) is read"
    scale = params.get("scale")
    if scale is not None and not (isinstance(scale, (int, float)) and scale > 0):
        return f"softmax scale {scale!r} (the kernel takes a positive constant)"
    return params["query"], params["key"], params["value"], mask, scale  # type: ignore[return-value]


def value_parts(v: torch.fx.Node, attention: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """(head, tail), each (B, S_i, H, D), if the values are ``cat([head, tail], dim=1)`` viewed as
    (B, H, S, D) and read only by ``attention`` (a joint attention's text and image values): the
    kernel then reads both parts and the concatenation copy is never made."""
    if len(v.users) != 1 or not swaps_dims_1_and_2(v):
        return None
    cat = v.args[0]
    if not (calls(cat, aten.cat.default) and len(cat.users) == 1):
        return None
    parts, dim = cat.args[0], cat.args[1] if len(cat.args) > 1 else 0
    if len(parts) != 2 or dim % 4 != 1 or any(meta_value(part) is None for part in parts):
        return None
    return parts[0], parts[1]


class Fp8Attention(Fp8Pass):
    name = "fp8-attention"
    why = "attention products on FP8 tensor cores (Q per row, K and V per key tile), twice bf16's peak rate"
    default_config = Fp8Config(attention=True)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        windows: list[tuple[int, int, int]] = []
        joined_values = 0
        for target in TARGETS:
            for node, (q, k, v, mask, scale) in accepted_matches(graph, target, match, ctx, RULE):
                q_val, k_val = meta_value(q), meta_value(k)
                keys = static_int(k_val.shape[2])  # None: a symbolic key count (dynamic shapes)
                with graph.inserting_before(node):
                    bias, window = None, (0, -1)  # -1: to the last key
                    if mask is not None:
                        if keys is not None:  # the window analysis works on known lengths
                            window = bias_window(mask, keys)
                            windows.append((*window, keys))
                        key_arg = keys if keys is not None else size_arg(graph, k, 2)
                        mask_batch = meta_value(mask).shape[0]
                        bias = graph.call_function(aten.reshape.default, (mask, [size_arg(graph, mask, 0), key_arg]))
                        if not known_equal(mask_batch, q_val.shape[0]):  # a (1, S_k) mask for every sample
                            bias = graph.call_function(aten.expand.default, (bias, [size_arg(graph, q, 0), key_arg]))
                        stamp(bias, pass_name=self.name, rule=RULE)
                    softmax_scale = q_val.shape[3] ** -0.5 if scale is None else scale
                    v_tail = None
                    parts = value_parts(v, node)
                    if parts is not None:
                        v, v_tail = (graph.call_function(aten.permute.default, (part, [0, 2, 1, 3])) for part in parts)
                        joined_values += 1
                    fused = graph.call_function(torch.ops.kopt.fp8_attention.default,
                                                (q, k, v, bias, float(softmax_scale), *window, v_tail))
                    with fake_mode_for(q_val):  # its sizes may be symbolic: allocate it as a fake
                        fused.meta["val"] = kernel.empty_output(q_val)
                if node.target is aten.scaled_dot_product_attention.default:
                    replace(node, fused, pass_name=self.name, rule=RULE)
                else:
                    for user in list(node.users):
                        if user.args[1] == 0:
                            replace(user, fused, pass_name=self.name, rule=RULE)
                        graph.erase_node(user)  # the output, or an unread log-sum-exp
                graph.erase_node(node)
        graph.eliminate_dead_code()
        if joined_values:
            ctx.notes.append(f"{joined_values} attention(s) read their values from two parts (text, image): "
                             f"no concatenation copy")
        for start, end, keys in sorted(set(windows)):
            count = windows.count((start, end, keys))
            ctx.notes.append(f"{count} key mask(s) provably zero outside keys [{start}, {end}) of {keys}: "
                             f"{keys - (end - start)} keys skip the mask add")
