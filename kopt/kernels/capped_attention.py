"""Attention with soft-capped logits and an additive mask, in one kernel:

    s = cap · tanh(scale · q·kᵀ / cap)     (``softcap`` = cap; without it s = scale · q·kᵀ)
    s = s + bias                          (an additive mask: 0 / −inf, or any float, broadcast over
                                           batch and heads)
    o = softmax(s) · v

for Q (B, H, S_q, D) and K, V (B, H / G, S_k, D): G query heads share a key/value head (grouped-query
attention), read where they lie instead of repeated.

Why: torch's fused attention kernels take no soft-cap, so a model with one (Gemma 2: cap 50 on every
layer's logits) spells its attention out — a batched GEMM writing the (B, H, S_q, S_k) logits, the
cap, the mask and the softmax over them, and a second batched GEMM reading the probabilities back.
At Gemma-2-9B's prefill (16 heads, 2048 tokens) those logits are 134 MB per layer in bf16, written
and read several times; here they never leave the chip (FlashAttention's online softmax, in float32).

Masked tiles are skipped without knowing the mask's shape: :func:`_live_keys_kernel` reads the mask
once per call (one program per tile) and records, per tile of BLOCK_M query rows, the first and last
tile of BLOCK_N keys holding any entry above the mask dtype's lowest value (−inf, or the finite
``torch.finfo(dtype).min`` that transformers' and diffusers' masks use), and the first and last
holding any entry that is not 0; the attention runs over the first span only, and adds the mask only
within the second (the tiles between hold zeros: a causal mask is read on its diagonal only). A causal
or sliding-window mask then costs about half the work of a full one, and a mask with holes is simply
computed. Why skipping is exact: in a row with an entry above half the lowest value (a *normal* key;
the same pass counts them per row), the running maximum is at least that entry's logit, so a lowest-
valued entry's weight is exp(−|lowest| / 2 + the logits' spread): 0 in float32 for bf16 and float32
masks, and for float16 ones (lowest −65,504) while logits stay within ±16,000. A row tile holding a
row without a normal key (all masked: the model's softmax then averages over every key, or gives NaN
for −inf) attends to every key with the mask added, as the model does. A NaN in the mask is neither
low nor 0, so its tile is kept and the NaN reaches the output, as in the model's softmax.

Numerics: logits, cap, mask and softmax in float32 (the model rounds its logits to bf16 after the GEMM
and after each step: up to 0.125 of absolute error at a cap of 50); probabilities are rounded to V's
dtype for the second product, as in any flash kernel. A query row whose keys are all masked divides
0 by 0 and gives NaN, as the model's softmax over −inf does. On a GPU the tanh is the hardware's
approximation (:func:`kopt.kernels._fastmath.tanh`: at most 0.025 on a logit at a cap of 50, a fifth of
what the model's bf16 rounding of that logit costs, and the same again for Inductor's lowering of the
spelled-out form, which rounds the first product's output to bf16): three special-function
instructions per logit would otherwise bound the kernel more than its tensor-core products at a
head dim of 256.

FLOPs: 4·B·H·S_q·S_k·D over the keys not masked. Spec: :func:`reference`. Interpreted on the CPU
(exact tanh) the kernel meets float64 to float32's rounding; on a GPU the tanh's approximation adds
the error above, which ``fuse-attention``'s tolerance contract allows.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch.utils.flop_counter import register_flop_formula

from kopt.kernels import _autotune
from kopt.kernels._autotune import Config, pow2_bucket, shape_key
from kopt.kernels._fastmath import exp2, fast_math, tanh

__all__ = ["candidates", "capped_attention", "check", "launch", "reference"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ----------------------------------------------------------------------------- reference (spec)
def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, scale: float,
              softcap: float | None = None) -> torch.Tensor:
    """The spec in q's dtype's arithmetic (float64 inputs give a float64 reference): K and V repeated
    to Q's heads, the logits capped and masked, softmax, product."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.to(s.dtype)
    return torch.softmax(s, dim=-1) @ v


# ----------------------------------------------------------------------------- kernels
SPAN_INTS = 4  # int32 per row tile: S_k − first key seen, end of the keys seen, the same for the keys masked
_SPAN = tl.constexpr(SPAN_INTS)


@triton.jit
def _live_keys_kernel(bias_ptr, span_ptr, normal_ptr, low, half_low, S_q, S_k, n_heads,
                      stride_b, stride_h, stride_m, stride_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One (BLOCK_M x BLOCK_N) tile of one (batch, head) of the mask: widen its row tile's spans to
    cover it — the keys *seen* if any entry is above ``low`` (the mask dtype's lowest value), the keys
    *masked* if any entry is not 0 (the tiles whose logits the mask changes) — and add to each row's
    count of *normal* entries (above ``half_low``) at ``normal_ptr``. A row tile's spans are SPAN_INTS
    int32 at ``span_ptr`` + SPAN_INTS·(its index), zeroed before: (S_k − first, end) of each, raised by
    atomic max, so a row tile that sees no key keeps [S_k, 0), an empty loop. One program per tile: the
    mask is read at once."""
    bh = tl.program_id(0)
    tile_m = tl.program_id(1)
    start = tl.program_id(2) * BLOCK_N
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = start + tl.arange(0, BLOCK_N)
    base = bias_ptr + (bh // n_heads).to(tl.int64) * stride_b + (bh % n_heads).to(tl.int64) * stride_h
    inside = (rows < S_q)[:, None] & (cols < S_k)[None, :]
    x = tl.load(base + rows[:, None].to(tl.int64) * stride_m + cols[None, :] * stride_n, mask=inside,
                other=float("-inf")).to(tl.float32)
    span = span_ptr + (bh * tl.num_programs(1) + tile_m) * _SPAN
    if tl.sum((~(x <= low)).to(tl.int32)) > 0:  # NaN counts as seen
        tl.atomic_max(span, S_k - start)
        tl.atomic_max(span + 1, start + BLOCK_N)
    normal = tl.sum((~(x <= half_low)).to(tl.int32), axis=1)
    tl.atomic_add(normal_ptr + bh.to(tl.int64) * S_q + rows, normal, mask=(rows < S_q) & (normal > 0))
    if tl.sum((tl.where(inside, x, 0.0) != 0.0).to(tl.int32)) > 0:  # and as masked
        tl.atomic_max(span + 2, S_k - start)
        tl.atomic_max(span + 3, start + BLOCK_N)


@triton.jit
def _attend(q, acc, m_i, l_i, k_base, v_base, bias_rows, first, end, S_k, pre, post, dims, dim_in, row_in,
            stride_kn, stride_kd, stride_vn, stride_vd, stride_bn,
            MASKED: tl.constexpr, SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
            UPCAST: tl.constexpr, FAST: tl.constexpr):
    """The online softmax over key tiles [first, end): (acc, m_i, l_i) updated. ``MASKED``: add the
    mask's tile to the logits (the others are known to be all zero there)."""
    keys = tl.arange(0, BLOCK_N)
    for start in range(first, end, BLOCK_N):
        cols = start + keys
        col_in = cols < S_k
        k = tl.load(k_base + cols[None, :] * stride_kn + dims[:, None] * stride_kd,
                    mask=col_in[None, :] & dim_in[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, k, input_precision=PRECISION)
        if SOFTCAP:
            s = post * tanh(s * pre, FAST)
        else:
            s = s * pre
        if MASKED:
            s += tl.load(bias_rows + cols[None, :] * stride_bn, mask=row_in[:, None] & col_in[None, :],
                         other=0.0).to(tl.float32)
        s = tl.where(col_in[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # all masked so far: exp2(-inf - 0) = 0
        alpha = exp2((m_i - m_use) * 1.4426950408889634, FAST)
        p = exp2((s - m_use[:, None]) * 1.4426950408889634, FAST)  # a flushed subnormal p adds nothing seen
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + cols[:, None] * stride_vn + dims[None, :] * stride_vd,
                    mask=col_in[:, None] & dim_in[None, :], other=0.0)
        p = p.to(v.dtype)  # rounded as the second product takes it
        if UPCAST:
            p = p.to(tl.float32)
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _capped_attention_kernel(q_ptr, k_ptr, v_ptr, bias_ptr, span_ptr, normal_ptr, out_ptr, H, GROUPS, S_q, S_k, D,
                             pre, post, bias_heads, spans_per_head,
                             stride_qb, stride_qh, stride_qm, stride_qd,
                             stride_kb, stride_kh, stride_kn, stride_kd,
                             stride_vb, stride_vh, stride_vn, stride_vd,
                             stride_bb, stride_bh, stride_bm, stride_bn,
                             stride_ob, stride_oh, stride_om, stride_od,
                             HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                             UPCAST: tl.constexpr, EVEN_D: tl.constexpr, FAST: tl.constexpr):
    # With a mask, each row tile's keys are three loops: the seen tiles before the first that the mask
    # changes, those it changes (the diagonal of a causal mask), the seen tiles after — only the middle
    # one loads the mask, the others hold no mask tile in registers (FlashAttention's causal split,
    # found here from the mask's values, not its kind).
    tile_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    kv_head = h // GROUPS
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_in = rows < S_q
    dim_in = dims < D
    if EVEN_D:  # the head dim is the tile's: no lane of it to mask (fewer predicates held in registers)
        dim_in = dims < BLOCK_D
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + rows[:, None] * stride_qm + dims[None, :] * stride_qd,
                mask=row_in[:, None] & dim_in[None, :], other=0.0)
    if UPCAST:  # Triton's CPU interpreter multiplies 16-bit floats wrongly: products in float32 there
        q = q.to(tl.float32)
    k_base = k_ptr + b * stride_kb + kv_head * stride_kh
    v_base = v_ptr + b * stride_vb + kv_head * stride_vh
    bias_rows = bias_ptr + b * stride_bb + h * stride_bh + rows[:, None] * stride_bm
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if HAS_BIAS:
        bias_b = tl.where(stride_bb == 0, 0, b)  # the spans of this (batch, head) of the mask
        bias_h = tl.where(stride_bh == 0, 0, h)
        span = span_ptr + ((bias_b * bias_heads + bias_h) * spans_per_head + tile_m) * _SPAN
        first = S_k - tl.load(span)
        end = tl.load(span + 1)
        masked_first = tl.minimum(tl.maximum(S_k - tl.load(span + 2), first), end)
        masked_end = tl.maximum(tl.minimum(tl.load(span + 3), end), masked_first)
        normal = tl.load(normal_ptr + (bias_b * bias_heads + bias_h) * S_q + rows, mask=row_in, other=1)
        if tl.min(normal) == 0:  # a row with every key masked: all of them, as the model's softmax
            first = first * 0
            end = first + S_k
            masked_first = first
            masked_end = end
        acc, m_i, l_i = _attend(q, acc, m_i, l_i, k_base, v_base, bias_rows, first, masked_first, S_k, pre, post,
                                dims, dim_in, row_in, stride_kn, stride_kd, stride_vn, stride_vd, stride_bn,
                                False, SOFTCAP, BLOCK_N, PRECISION, UPCAST, FAST)
        acc, m_i, l_i = _attend(q, acc, m_i, l_i, k_base, v_base, bias_rows, masked_first, masked_end, S_k, pre,
                                post, dims, dim_in, row_in, stride_kn, stride_kd, stride_vn, stride_vd, stride_bn,
                                True, SOFTCAP, BLOCK_N, PRECISION, UPCAST, FAST)
        acc, m_i, l_i = _attend(q, acc, m_i, l_i, k_base, v_base, bias_rows, masked_end, end, S_k, pre, post,
                                dims, dim_in, row_in, stride_kn, stride_kd, stride_vn, stride_vd, stride_bn,
                                False, SOFTCAP, BLOCK_N, PRECISION, UPCAST, FAST)
    else:
        acc, m_i, l_i = _attend(q, acc, m_i, l_i, k_base, v_base, bias_rows, 0, S_k, S_k, pre, post,
                                dims, dim_in, row_in, stride_kn, stride_kd, stride_vn, stride_vd, stride_bn,
                                False, SOFTCAP, BLOCK_N, PRECISION, UPCAST, FAST)
    out = acc / l_i[:, None]
    tl.store(out_ptr + b * stride_ob + h * stride_oh + rows[:, None] * stride_om + dims[None, :] * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=row_in[:, None] & dim_in[None, :])


# ----------------------------------------------------------------------------- launch
_TILES = ((64, 64, 4), (64, 64, 8), (64, 32, 8), (128, 64, 8), (128, 32, 8), (64, 32, 4), (128, 128, 8),
          (64, 128, 4))  # (BLOCK_M, BLOCK_N, num_warps), in order of preference
_MAX_LIVE_PER_THREAD = 80  # float32 accumulator and logits per thread; more spills (sass.py attention)


def _block_d(head_dim: int) -> int:
    return max(triton.next_power_of_2(head_dim), 16)


def shared_bytes(block_m: int, block_n: int, block_d: int, stages: int, element: int = 2) -> int:
    """Shared memory a launch config asks for: the Q tile, ``stages`` buffered K and V tiles, and a
    float32 BLOCK_M × BLOCK_N scratch for the logits' layout change (Triton 3.6 on sm_90 asked for
    exactly this: 245,760 bytes at 64 × 64, head 256, 3 stages: ``capped_attention-s26d.md``)."""
    return element * (block_m * block_d + stages * 2 * block_n * block_d) + 4 * block_m * block_n


@functools.cache
def _candidates(block_d: int, shared_limit: int | None) -> tuple[Config, ...]:
    out = []
    for block_m, block_n, warps in _TILES:
        if (block_m * block_d + block_m * block_n) // (32 * warps) > _MAX_LIVE_PER_THREAD:
            continue
        for stages in (2, 3):
            if shared_limit is None or shared_bytes(block_m, block_n, block_d, stages) <= shared_limit:
                out.append({"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages})
    return tuple(out)


def candidates(head_dim: int, shared_limit: int | None = None) -> list[Config]:
    """Launch configs for a head dim, the default first: tiles of 64/128 query rows by 32..128 keys
    over 4 or 8 warps and 2 or 3 pipeline stages, keeping those whose float32 accumulator and logits
    take at most 80 registers a thread (compiled for sm_90, larger ones spill: a 256-wide head
    allows 64 × 64 over 8 warps but not over 4) and, given the device's ``shared_limit`` (bytes a
    block may opt in to), those that fit it (:func:`shared_bytes`; a config that does not cannot
    launch, and trying it only adds a warning)."""
    return [dict(c) for c in _candidates(_block_d(head_dim), shared_limit)]


def shared_limit(device: torch.device) -> int | None:
    """Shared memory a block may opt in to on ``device`` (None off CUDA: no limit to apply)."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return getattr(props, "shared_memory_per_block_optin", None)


def check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, scale: float,
          softcap: float | None) -> None:
    """Raise ValueError unless the operands are what :func:`launch` takes (module docstring)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"capped_attention: q, k, v must be (B, H, S, D), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    b, h, s_q, d = q.shape
    if (k.shape[0], k.shape[3]) != (b, d) or k.shape != v.shape or not k.shape[1] or h % k.shape[1]:
        raise ValueError(f"capped_attention: k and v must be (B, H / G, S_k, D) for q {tuple(q.shape)}, got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"capped_attention: q, k, v must share one of {_DTYPES}, got {q.dtype}, {k.dtype}, {v.dtype}")
    if bias is not None:
        try:
            torch.broadcast_shapes(bias.shape, (b, h, s_q, k.shape[2]))
        except RuntimeError:
            raise ValueError(f"capped_attention: bias {tuple(bias.shape)} does not broadcast to "
                             f"{(b, h, s_q, k.shape[2])}") from None
        if bias.dim() > 4 or not bias.dtype.is_floating_point:
            raise ValueError(f"capped_attention: bias must be a float tensor of at most 4 dims, got "
                             f"{bias.dtype} {tuple(bias.shape)}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"capped_attention: softcap must be positive, got {softcap}")
    if not scale == scale:
        raise ValueError("capped_attention: scale is NaN")


def empty_output(q: torch.Tensor) -> torch.Tensor:
    """The (B, H, S, D) output laid out as (B, S, H, D), as aten's attention kernels return it: the
    model's following ``transpose(1, 2).reshape(B, S, H·D)`` is then a view."""
    b, h, s, d = q.shape
    return torch.empty((b, s, h, d), dtype=q.dtype, device=q.device).permute(0, 2, 1, 3)


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, scale: float,
           softcap: float | None = None, *, config: Config | None = None) -> torch.Tensor:
    """Run the kernels (the mask's key spans, then the attention); the output is (B, H, S_q, D) in
    q's dtype, laid out as :func:`empty_output` says. ``config`` forces a launch config (one of
    ``candidates``); by default the autotuner picks it."""
    check(q, k, v, bias, scale, softcap)
    b, h, s_q, d = q.shape
    s_k = k.shape[2]
    out = empty_output(q)
    if not out.numel():
        return out
    full_bias = None if bias is None else bias.expand(b, h, s_q, s_k)
    bias_batches = 1 if full_bias is None or full_bias.stride(0) == 0 else b
    bias_heads = 1 if full_bias is None or full_bias.stride(1) == 0 else h
    bias_strides = full_bias.stride() if full_bias is not None else (0, 0, 0, 0)
    block_d = _block_d(d)

    def run(cfg: Config, dst: torch.Tensor) -> None:
        block_m, block_n = cfg["BLOCK_M"], cfg["BLOCK_N"]
        tiles_m = triton.cdiv(s_q, block_m)
        spans = torch.zeros((bias_batches * bias_heads * tiles_m * SPAN_INTS,), dtype=torch.int32, device=q.device)
        normal = torch.zeros((bias_batches * bias_heads * s_q if full_bias is not None else 1,), dtype=torch.int32,
                             device=q.device)
        if full_bias is not None:
            low = torch.finfo(full_bias.dtype).min
            _live_keys_kernel[(bias_batches * bias_heads, tiles_m, triton.cdiv(s_k, block_n))](
                full_bias, spans, normal, low, low / 2, s_q, s_k, bias_heads, *bias_strides, BLOCK_M=block_m,
                BLOCK_N=block_n)
        pre, post = (scale / softcap, softcap) if softcap is not None else (scale, 1.0)
        _capped_attention_kernel[(tiles_m, b * h)](
            q, k, v, full_bias if full_bias is not None else q, spans, normal, dst, h, h // k.shape[1], s_q, s_k, d,
            pre, post, bias_heads, tiles_m, *q.stride(), *k.stride(), *v.stride(), *bias_strides, *dst.stride(),
            HAS_BIAS=full_bias is not None, SOFTCAP=softcap is not None, BLOCK_M=block_m, BLOCK_N=block_n,
            BLOCK_D=block_d, PRECISION="ieee" if q.dtype == torch.float32 else None,
            UPCAST=_autotune.interpreting(), EVEN_D=d == block_d, FAST=fast_math(q.device),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])

    key = shape_key(b=b, h=h, groups=h // k.shape[1], s_q=pow2_bucket(s_q), s_k=pow2_bucket(s_k), d=d,
                    mask=f"{bias_batches}x{bias_heads}" if full_bias is not None else "none",
                    softcap=softcap is not None, dtype=q.dtype)
    _autotune.launch_tuned("capped_attention", key, candidates(d, shared_limit(q.device)), run, (out,), q.device,
                           config, scratch=lambda: (empty_output(q),))
    return out


# ----------------------------------------------------------------------------- custom op
@torch.library.custom_op("kopt::capped_attention", mutates_args=())
def capped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, scale: float,
                     softcap: float | None = None) -> torch.Tensor:
    """``softmax(cap(scale · Q Kᵀ) + bias) V`` (B, H, S, D) → (B, H, S, D); Triton on CUDA, the spec elsewhere."""
    if q.is_cuda:
        return launch(q, k, v, bias, scale, softcap)
    check(q, k, v, bias, scale, softcap)
    return empty_output(q).copy_(reference(q.float(), k.float(), v.float(), bias, scale, softcap))


@capped_attention.register_fake
def _(q, k, v, bias, scale, softcap=None):
    return empty_output(q)


def flops(q: torch.Tensor, k: torch.Tensor) -> int:
    """4·B·H·S_q·S_k·D: the two products, every key counted (a mask's skipped tiles are not known here)."""
    return 4 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.shape[3]


@register_flop_formula(torch.ops.kopt.capped_attention)
def _flop_formula(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    """torch's FLOP counter (and the agent's roofline, :mod:`kopt.agent.floor`) for the op: :func:`flops`."""
    b, h, s_q, d = q_shape
    return 4 * b * h * s_q * k_shape[2] * d
