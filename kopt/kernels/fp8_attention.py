"""Attention with FP8 tensor-core products: ``softmax(Q Kᵀ · scale + bias) V``, non-causal.

    K, V  → FP8 once per call (:func:`quantize_kv`): one scale per tile of BLOCK_N keys each, V
            written transposed (keys contiguous), the layout Hopper's FP8 tensor cores take for
            the second product;
    Q     → FP8 per query row, inside the attention kernel (each Q tile is loaded once);
    S     = (q8 · k8ᵀ) · s_q · s_k(tile) · scale + bias     exact rescaling of the FP8 product
    P     = exp(S − running max) ∈ [0, 1], times 448 · s_v(tile) / s_v(max), rounded to FP8 for P · V
    O     = Σ (p8 · v8) · s_v(max) / 448 / Σ P               online softmax (FlashAttention's recurrence)

Per-tile K and V scales (rather than per key) make every scale a per-row vector of the tile: a
logit costs one FMA and one exp2, and P · V accumulates straight into the output accumulator on
the tensor cores (see :func:`_attend_chunk`). The softmax's per-element work, not the products,
bounds FP8 attention on Hopper, so this is where the time is.

Why: the DiT's attention runs bf16 tensor-core products, and FP8 products have twice bf16's peak
rate. The per-row scales of Q and the
per-tile scales of K keep the logits' relative error near FP8's own (~2⁻⁴ per element, averaging
over the head dim; normalised keys have similar magnitudes within a tile);
``bias`` is an additive key mask (B, S_k), e.g. Qwen-Image's 0 / −inf text padding.

The contract is ``quality`` (the FP8 gate): :func:`reference` is the same quantization of Q, K
and V followed by exact float32 attention; the kernel additionally rounds P to FP8.

``python benchmarks/micro/attention.py`` times it against torch's bf16 SDPA at the production
shapes (``benchmarks/RESULTS.md`` has the numbers). With the mask window (the pass proves the mask
zero on the image keys) a masked shape runs at the unmasked one's speed. A forward that runs at
the card's power cap lowers the SM clock, which costs this kernel more than cuDNN's (``python
benchmarks/tools/clocks.py`` reads the clock during a run). What is left is Hopper's warp
specialisation (producer warps feeding TMA, two softmax warpgroups taking turns), which this
Triton loop does not get on sm_90. Hence ``Fp8Config(attention=False)`` by default: it pays on
Qwen-Image, not on FLUX.2;
``benchmarks/micro/attention.py`` times every launch config against torch's SDPA.

FLOPs: 4·B·H·S_q·S_k·D. Bytes of the K/V quantization: read 2·B·H·S_k·D·e, write half of it.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kopt.fp8.quantize import FP8, FP8_MAX, MIN_AMAX
from kopt.kernels import _autotune
from kopt.kernels._autotune import Config, pow2_bucket, shape_key
from kopt.kernels._pdl import begin, launch_options
from kopt.kernels._rows import fp8_rows, fp8_scale, fp8_values

__all__ = ["candidates", "check", "empty_output", "fp8_attention", "launch", "quantize_kv", "reference"]

HEAD_DIMS = (32, 64, 128)
SPEC_BLOCK_N = 128  # the K/V tile of the spec (the kernel's tile is its BLOCK_N)
_LOG2E = 1.4426950408889634  # log2(e)


# ----------------------------------------------------------------------------- reference (spec)
def _rows_scaled(x: torch.Tensor) -> torch.Tensor:
    """x rounded through FP8 with one scale per last-dim row (float32 result)."""
    xf = x.float()
    scale = xf.abs().amax(-1, keepdim=True).clamp(min=MIN_AMAX) / FP8_MAX
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).float() * scale


def _tiles_scaled(v: torch.Tensor, block_n: int) -> torch.Tensor:
    """v (B, H, S, D) rounded through FP8 with one scale per tile of ``block_n`` keys."""
    b, h, s, d = v.shape
    padded = -(-s // block_n) * block_n
    vf = torch.nn.functional.pad(v.float(), (0, 0, 0, padded - s)).reshape(b, h, padded // block_n, block_n * d)
    return _rows_scaled(vf).reshape(b, h, padded, d)[:, :, :s]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None,
              scale: float | None = None, block_n: int = SPEC_BLOCK_N) -> torch.Tensor:
    """Spec: Q per row, K and V per ``block_n``-key tile through FP8, then float32 attention."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = _rows_scaled(q) @ _tiles_scaled(k, block_n).transpose(-1, -2) * scale
    if bias is not None:
        logits = logits + bias.float()[:, None, None, :]
    return (torch.softmax(logits, dim=-1) @ _tiles_scaled(v, block_n)).to(q.dtype)


# ----------------------------------------------------------------------------- Triton kernels
@triton.jit
def _kv_quant_kernel(k_ptr, v_ptr, vt_ptr, k8_ptr, v8t_ptr, ks_ptr, vs_ptr, H, S_k, S_kp, S_v,
                     stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
                     stride_vtb, stride_vth, stride_vts, D: tl.constexpr, BLOCK_N: tl.constexpr,
                     N_CHUNKS: tl.constexpr, V_TAIL: tl.constexpr, PDL: tl.constexpr):
    begin(PDL)
    # V_TAIL: the values are cat([v, vt]) along the keys (v holds the first S_v): read from both, so
    # that the concatenation is never materialized
    chunk = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    offs_n = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    valid = offs_n[:, None] < S_k
    k = tl.load(k_ptr + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_ks + offs_d[None, :],
                mask=valid, other=0.0).to(tl.float32)
    ks = fp8_scale(tl.max(tl.max(tl.abs(k), axis=1), axis=0))
    tl.store(k8_ptr + bh * S_kp * D + offs_n[:, None] * D + offs_d[None, :],
             fp8_values(k, ks).to(k8_ptr.dtype.element_ty))
    tl.store(ks_ptr + bh * N_CHUNKS + chunk, ks)
    if V_TAIL:
        head = offs_n[:, None] < S_v
        v = tl.load(v_ptr + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :],
                    mask=valid & head, other=0.0).to(tl.float32)
        v += tl.load(vt_ptr + b * stride_vtb + h * stride_vth + (offs_n[:, None] - S_v) * stride_vts + offs_d[None, :],
                     mask=valid & (offs_n[:, None] >= S_v), other=0.0).to(tl.float32)
    else:
        v = tl.load(v_ptr + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :],
                    mask=valid, other=0.0).to(tl.float32)
    vs = fp8_scale(tl.max(tl.max(tl.abs(v), axis=1), axis=0))
    tl.store(v8t_ptr + bh * D * S_kp + offs_d[None, :] * S_kp + offs_n[:, None],
             fp8_values(v, vs).to(v8t_ptr.dtype.element_ty))
    tl.store(vs_ptr + bh * N_CHUNKS + chunk, vs)


@triton.jit
def _scaled_probabilities(qk, c, m_i, log2_p_scale, bias_ptr, b, stride_bias_b, offs_n, S_k,
                          HAS_BIAS: tl.constexpr, MASKED: tl.constexpr):
    """(new running max, P · 448 · s_v(tile) / s_v(max)) of one tile's raw FP8 products ``qk``."""
    if HAS_BIAS:
        if MASKED:
            key_bias = tl.load(bias_ptr + b * stride_bias_b + offs_n, mask=offs_n < S_k, other=0.0)
        else:
            key_bias = tl.load(bias_ptr + b * stride_bias_b + offs_n)
        qk = qk * c[:, None] + key_bias.to(tl.float32)[None, :] * 1.4426950408889634  # log2(e): base-2 logits
    if MASKED:
        qk = tl.where(offs_n[None, :] < S_k, qk, float("-inf"))
    if HAS_BIAS:
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    else:
        m_new = tl.maximum(m_i, tl.max(qk, axis=1) * c)  # c > 0: the max of the scaled row
    offset = tl.where(m_new == float("-inf"), 0.0, m_new) - log2_p_scale
    if HAS_BIAS:
        p = tl.exp2(qk - offset[:, None])
    else:
        p = tl.exp2(qk * c[:, None] - offset[:, None])  # one FMA and one exp2 per logit
    return m_new, p


@triton.jit
def _attend_chunk(q8, row_scale, m_i, l_i, acc, chunk, log2_vs_max, k8_ptr, v8t_ptr, ks_ptr, vs_ptr, bias_ptr,
                  b, bh, S_k, S_kp, stride_bias_b, HAS_BIAS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                  N_CHUNKS: tl.constexpr, MASKED: tl.constexpr, USE_TMA: tl.constexpr):
    """One key tile of the online softmax; ``MASKED`` only for the last tile when S_k does not fill it.

    Every scale is folded into per-row vectors, so each logit costs one FMA and one exp2:
    ``qk · c − offset`` with c = s_q · s_k(tile) · scale · log2(e), and the offset also holding
    log2(448 · s_v(tile) / s_v(max)), so that P comes out of exp2 already scaled for the FP8 cast
    and for this tile's V scale; P · V then accumulates straight into ``acc`` (in units of
    s_v(max) / 448, applied once at the end) and ``l_i`` sums the unscaled P.

    A key mask costs one more add per logit, a large share of the softmax's work. Deciding per
    tile at run time whether the mask is all zeros needs a branch in the loop, which Triton 3.6's
    software pipeliner rejects; instead the caller may prove a window of keys outside which the mask
    is zero, and the kernel runs its key loop in three parts (``HAS_BIAS`` only in the middle one).
    ``USE_TMA``: ``k8_ptr`` and
    ``v8t_ptr`` are tensor descriptors of the (BH·S_kp, D) keys and (BH·D, S_kp) transposed values,
    so that the pipelined loop loads tiles with Hopper's TMA instead of per-thread addresses."""
    offs_n = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    if USE_TMA:
        k8 = k8_ptr.load([(bh * S_kp + chunk * BLOCK_N).to(tl.int32), 0])
    else:
        k8 = tl.load(k8_ptr + bh * S_kp * D + offs_n[:, None] * D + offs_d[None, :])
    c = row_scale * tl.load(ks_ptr + bh * N_CHUNKS + chunk)
    qk = tl.dot(q8, tl.trans(k8))
    log2_p_scale = 8.807354922057604 + tl.log2(tl.load(vs_ptr + bh * N_CHUNKS + chunk)) - log2_vs_max  # log2(448 r)
    m_new, p = _scaled_probabilities(qk, c, m_i, log2_p_scale, bias_ptr, b, stride_bias_b, offs_n, S_k,
                                     HAS_BIAS, MASKED)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with every key masked so far
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1) * tl.exp2(-log2_p_scale)
    if USE_TMA:
        vt8 = v8t_ptr.load([(bh * D).to(tl.int32), chunk * BLOCK_N])
    else:
        vt8 = tl.load(v8t_ptr + bh * D * S_kp + offs_d[:, None] * S_kp + offs_n[None, :])
    acc = tl.dot(p.to(tl.float8e4nv, fp_downcast_rounding="rtne"), tl.trans(vt8), acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _fp8_attention_kernel(q_ptr, k8_ptr, v8t_ptr, ks_ptr, vs_ptr, bias_ptr, out_ptr, out_scale_ptr, H, S_q, S_k, S_kp,
                          qk_scale, stride_qb, stride_qh, stride_qs, stride_ob, stride_oh, stride_os,
                          stride_bias_b, HAS_BIAS: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, N_CHUNKS: tl.constexpr, N_FULL: tl.constexpr,
                          CHUNKS_POW2: tl.constexpr, USE_TMA: tl.constexpr, FIRST_BIASED: tl.constexpr,
                          END_BIASED: tl.constexpr, OUT_FP8: tl.constexpr, HEADS_POW2: tl.constexpr, PDL: tl.constexpr):
    begin(PDL)
    # qk_scale = softmax scale · log2(e): the softmax runs in base 2 (exp2). N_FULL: the key tiles S_k
    # fills (no key mask); a partial last tile, if any, is the only masked one. Full tiles outside
    # [FIRST_BIASED, END_BIASED) skip the bias (it is zero there): three loops, no branch in any.
    # OUT_FP8: the output is written in FP8 with one scale per batch, stored for each of its rows
    # (see kopt.kernels.fp8_attention_quant for why that scale bounds every output).
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                mask=offs_m[:, None] < S_q, other=0.0).to(tl.float32)
    q8, qs = fp8_rows(q)
    q8 = q8.to(tl.float8e4nv)
    row_scale = qs * qk_scale
    chunks = tl.arange(0, CHUNKS_POW2)
    vs_max = tl.max(tl.load(vs_ptr + bh * N_CHUNKS + chunks, mask=chunks < N_CHUNKS, other=0.0), axis=0)
    log2_vs_max = tl.log2(vs_max)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for chunk in range(0, FIRST_BIASED):
        m_i, l_i, acc = _attend_chunk(q8, row_scale, m_i, l_i, acc, chunk, log2_vs_max, k8_ptr, v8t_ptr, ks_ptr,
                                      vs_ptr, bias_ptr, b, bh, S_k, S_kp, stride_bias_b, False, D,
                                      BLOCK_N, N_CHUNKS, False, USE_TMA)
    for chunk in range(FIRST_BIASED, END_BIASED):
        m_i, l_i, acc = _attend_chunk(q8, row_scale, m_i, l_i, acc, chunk, log2_vs_max, k8_ptr, v8t_ptr, ks_ptr,
                                      vs_ptr, bias_ptr, b, bh, S_k, S_kp, stride_bias_b, HAS_BIAS, D,
                                      BLOCK_N, N_CHUNKS, False, USE_TMA)
    for chunk in range(END_BIASED, N_FULL):
        m_i, l_i, acc = _attend_chunk(q8, row_scale, m_i, l_i, acc, chunk, log2_vs_max, k8_ptr, v8t_ptr, ks_ptr,
                                      vs_ptr, bias_ptr, b, bh, S_k, S_kp, stride_bias_b, False, D,
                                      BLOCK_N, N_CHUNKS, False, USE_TMA)
    if N_FULL < N_CHUNKS:
        m_i, l_i, acc = _attend_chunk(q8, row_scale, m_i, l_i, acc, N_CHUNKS - 1, log2_vs_max, k8_ptr, v8t_ptr,
                                      ks_ptr, vs_ptr, bias_ptr, b, bh, S_k, S_kp, stride_bias_b,
                                      HAS_BIAS, D, BLOCK_N, N_CHUNKS, True, USE_TMA)
    out = acc * (vs_max / 448.0) / l_i[:, None]
    if OUT_FP8:  # |out| <= (1 + 2^-4) · max |V| of the batch, every head: one scale from the V tile scales
        heads = tl.arange(0, HEADS_POW2)
        every_vs = tl.load(vs_ptr + (b * H + heads[:, None]) * N_CHUNKS + chunks[None, :],
                           mask=(heads[:, None] < H) & (chunks[None, :] < N_CHUNKS), other=0.0)
        out_scale = tl.max(tl.max(every_vs, axis=1), axis=0) * 1.0625
        out = fp8_values(out, out_scale)
        tl.store(out_scale_ptr + b * S_q + offs_m, tl.zeros([BLOCK_M], dtype=tl.float32) + out_scale,
                 mask=(offs_m < S_q) & (offs_m * 0 + h == 0))  # per element: Triton 3.9's interpreter
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=offs_m[:, None] < S_q)


# ----------------------------------------------------------------------------- launchers
DEFAULT_CONFIG: Config = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3}


# (BLOCK_M, BLOCK_N, num_warps, num_stages): the autotuner's candidates, the tiles that were fastest at
# FLUX.2's and Qwen-Image's shapes in benchmarks/micro/attention.py (128 x 64 tiles and 2-stage pipelines
# were much slower), the best ones also with TMA loads (which win at Qwen-Image's masked shape).
_TILES = ((128, 128, 8, 3), (64, 128, 4, 3), (128, 128, 4, 3), (64, 64, 4, 4), (64, 128, 4, 4))
_TMA_TILES = ((64, 128, 4, 3), (64, 128, 4, 4), (128, 128, 8, 3), (64, 64, 4, 4))


@functools.cache
def _candidates() -> tuple[Config, ...]:
    def config(tile: tuple[int, int, int, int], **variant: int) -> Config:
        block_m, block_n, warps, stages = tile
        return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages, **variant}

    out = [config(tile) for tile in _TILES] + [config(tile, USE_TMA=1) for tile in _TMA_TILES]
    assert out[0] == DEFAULT_CONFIG
    return tuple(out)


def candidates() -> list[Config]:
    """Launch configs (tile sizes, warps, software-pipeline stages); the default first. ``USE_TMA``
    variants load the K/V tiles through tensor descriptors."""
    return [dict(c) for c in _candidates()]


def quantize_kv(k: torch.Tensor, v: torch.Tensor, block_n: int, v_tail: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k8 (BH, S_kp, D), v8 transposed (BH, D, S_kp), per-tile K scales and per-tile V scales, each
    (BH, S_kp / block_n)), S_kp = S_k rounded up to ``block_n`` (padding: zeros). The values are
    ``cat([v, v_tail], dim=2)`` when ``v_tail`` is given."""
    b, h, s_k, d = k.shape
    chunks = triton.cdiv(s_k, block_n)
    s_kp = chunks * block_n
    k8 = torch.empty((b * h, s_kp, d), dtype=FP8, device=k.device)
    v8t = torch.empty((b * h, d, s_kp), dtype=FP8, device=k.device)
    ks = torch.empty((b * h, chunks), dtype=torch.float32, device=k.device)
    vs = torch.empty((b * h, chunks), dtype=torch.float32, device=k.device)
    tail = v if v_tail is None else v_tail
    _kv_quant_kernel[(chunks, b * h)](k, v, tail, k8, v8t, ks, vs, h, s_k, s_kp, v.shape[2],
                                      k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
                                      tail.stride(0), tail.stride(1), tail.stride(2), D=d, BLOCK_N=block_n,
                                      N_CHUNKS=chunks, V_TAIL=v_tail is not None, num_warps=4,
                                      **launch_options(k.device))
    return k8, v8t, ks, vs


def check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, scale: float | None,
          v_tail: torch.Tensor | None = None) -> None:
    """Raise ValueError unless the kernel takes these inputs (shapes, head dim, strides, mask, scale);
    with ``v_tail`` the values are ``cat([v, v_tail], dim=2)``."""
    if v_tail is not None:
        if v_tail.dim() != 4 or v.dim() != 4 or v_tail.shape[:2] != v.shape[:2] or v_tail.shape[3] != v.shape[3] \
                or v_tail.dtype != v.dtype or v_tail.stride(-1) != 1:
            raise ValueError(f"fp8_attention: v_tail {tuple(v_tail.shape)} {v_tail.dtype} must match v "
                             f"{tuple(v.shape)} {v.dtype} in all but the key dim, with a unit head-dim stride")
        if v.stride(-1) != 1:
            raise ValueError("fp8_attention: q, k and v need a unit stride along the head dim")
        v = torch.empty((*v.shape[:2], v.shape[2] + v_tail.shape[2], v.shape[3]), device="meta")  # the joined shape
    if scale is not None and not scale > 0:
        raise ValueError(f"fp8_attention: the softmax scale must be positive (the kernel takes row maxima of "
                         f"unscaled logits), got {scale}")
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"fp8_attention: q, k, v must be (B, H, S, D) with equal B, H, D and equal k/v shapes, "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[3] not in HEAD_DIMS:
        raise ValueError(f"fp8_attention: head dim must be one of {HEAD_DIMS}, got {q.shape[3]}")
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        raise ValueError("fp8_attention: q, k and v need a unit stride along the head dim")
    if bias is not None and bias.shape != (q.shape[0], k.shape[2]):
        raise ValueError(f"fp8_attention: bias must be a (B, S_k) = {(q.shape[0], k.shape[2])} key mask, "
                         f"got {tuple(bias.shape)}")


def empty_output(q: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The (B, H, S, D) output (in q's dtype unless given) laid out as (B, S, H, D), as aten's SDPA
    kernels return it: the model's following ``transpose(1, 2).reshape(B, S, H·D)`` is then a view."""
    b, h, s, d = q.shape
    return torch.empty((b, s, h, d), dtype=dtype or q.dtype, device=q.device).permute(0, 2, 1, 3)


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None,
           scale: float | None = None, *, config: Config | None = None,
           bias_window: tuple[int, int] | None = None, fp8_out: bool = False, v_tail: torch.Tensor | None = None
           ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Quantize K/V, run the attention kernel; the output is (B, H, S_q, D) in q's dtype, laid out
    as :func:`empty_output` says. ``bias_window`` = (start, end): the caller guarantees that
    ``bias`` is zero outside keys [start, end) (see :mod:`kopt.fx.match.key_mask_window`), so whole
    key tiles outside it skip the bias add; default: the bias may be nonzero anywhere. ``fp8_out``:
    return (the output in FP8, its (B, S_q) float32 row scales) instead, as
    :mod:`kopt.kernels.fp8_attention_quant` defines them. ``v_tail``: the values are
    ``cat([v, v_tail], dim=2)``, read from both (a joint attention's text and image values)."""
    check(q, k, v, bias, scale, v_tail)
    b, h, s_q, d = q.shape
    s_k = k.shape[2]
    start, end = (0, s_k) if bias_window is None else bias_window
    if not 0 <= start <= end <= s_k:
        raise ValueError(f"fp8_attention: bias window {bias_window} is not within [0, {s_k}]")
    if bias is None or start == end:
        start, end = 0, 0
    scale = d ** -0.5 if scale is None else scale
    out = empty_output(q, FP8 if fp8_out else None)
    out_scale = torch.empty((b, s_q), dtype=torch.float32, device=q.device)
    bias = None if bias is None else bias.contiguous()

    def run(cfg: Config, dst: torch.Tensor, dst_scale: torch.Tensor) -> None:
        block_n = cfg["BLOCK_N"]
        k8, v8t, ks, vs = quantize_kv(k, v, block_n, v_tail)
        chunks, full = vs.shape[1], s_k // block_n
        grid = (triton.cdiv(s_q, cfg["BLOCK_M"]), b * h)
        keys, values = k8, v8t
        if cfg.get("USE_TMA", 0):
            keys = TensorDescriptor.from_tensor(k8.view(-1, d), [block_n, d])
            values = TensorDescriptor.from_tensor(v8t.view(-1, k8.shape[1]), [d, block_n])
        _fp8_attention_kernel[grid](
            q, keys, values, ks, vs, bias if bias is not None else ks, dst, dst_scale,
            h, s_q, s_k, k8.shape[1], scale * _LOG2E,
            q.stride(0), q.stride(1), q.stride(2), dst.stride(0), dst.stride(1), dst.stride(2),
            bias.stride(0) if bias is not None else 0, HAS_BIAS=bias is not None, D=d,
            BLOCK_M=cfg["BLOCK_M"], BLOCK_N=block_n, N_CHUNKS=chunks, N_FULL=full,
            CHUNKS_POW2=triton.next_power_of_2(chunks), USE_TMA=bool(cfg.get("USE_TMA", 0)),
            FIRST_BIASED=min(start // block_n, full), END_BIASED=min(triton.cdiv(end, block_n), full),
            OUT_FP8=fp8_out, HEADS_POW2=triton.next_power_of_2(h),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **launch_options(q.device))

    key = shape_key(b=b, h=h, s_q=pow2_bucket(s_q), s_k=pow2_bucket(s_k), d=d, bias=bias is not None,
                    biased_keys=pow2_bucket(end - start), dtype=q.dtype, fp8_out=fp8_out)
    _autotune.launch_tuned("fp8_attention", key, candidates(), run, (out, out_scale), q.device, config,
                           scratch=lambda: (empty_output(q, out.dtype), torch.empty_like(out_scale)))
    return (out, out_scale) if fp8_out else out


# ----------------------------------------------------------------------------- custom op
@torch.library.custom_op("kopt::fp8_attention", mutates_args=())
def fp8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                  scale: float, bias_start: int = 0, bias_end: int = -1,
                  v_tail: torch.Tensor | None = None) -> torch.Tensor:
    """FP8 attention (B, H, S, D) → (B, H, S, D); the Triton kernels on CUDA, the spec elsewhere.
    ``bias`` is zero outside keys [bias_start, bias_end) (bias_end -1: S_k), as the caller guarantees;
    the values are ``cat([v, v_tail], dim=2)`` when ``v_tail`` is given."""
    window = (bias_start, k.shape[2] if bias_end < 0 else bias_end)
    if q.is_cuda:
        return launch(q, k, v, bias, scale, bias_window=window, v_tail=v_tail)
    check(q, k, v, bias, scale, v_tail)
    values = v if v_tail is None else torch.cat([v, v_tail], dim=2)
    return empty_output(q).copy_(reference(q, k, values, bias, scale))


@fp8_attention.register_fake
def _(q, k, v, bias, scale, bias_start=0, bias_end=-1, v_tail=None):
    return empty_output(q)


def flops(q: torch.Tensor, k: torch.Tensor) -> int:
    """4·B·H·S_q·S_k·D: the two products."""
    return 4 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.shape[3]

