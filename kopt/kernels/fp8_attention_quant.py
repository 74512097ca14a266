"""FP8 attention that writes its output in FP8, ready for the output projection's FP8 GEMM.

    o      = fp8_attention(q, k, v, bias, scale)                     (B, H, S_q, D), float32 inside
    s_o[b] = (1 + 2⁻⁴) · max |V[b]| / 448                           one scale per batch
    o8     = clamp(o / s_o[b], ±448).to(float8_e4m3fn),  row_scale (B, S_q) = s_o[b] on every row

Why: the projection after attention quantizes its input per row (``fp8-linear``). A row spans all
heads, which separate attention programs compute, so that quantization was a kernel of its own,
reading back the bf16 output the attention kernel had just written (plus one launch per
attention). Every output row is a convex combination of V's rows (softmax
weights sum to one), so |o| ≤ max |V| for every head at once; the kernel rounds P to FP8 (relative
error ≤ 2⁻⁴), hence the factor. Values above the bound in pathological rows (tiny P rounded up) are
clamped to ±448 · s_o. The bound is known before any output is: the maximum of the per-tile V
scales, which every program already reads. A bound-based scale costs almost no precision, because
e4m3 is floating point: every value above s_o · 2⁻⁶, i.e. above max |V| / 27000, keeps e4m3's full
3-bit mantissa, as it would with its own row's scale.

Contract: ``quality`` (the FP8 gate), like :mod:`kopt.kernels.fp8_attention`. The spec is that
module's spec followed by this quantization.
"""

from __future__ import annotations

import torch

from kopt.fp8.quantize import FP8, FP8_MAX
from kopt.kernels import fp8_attention as attention

__all__ = ["HEADROOM", "fp8_attention_quant", "output_scale", "reference"]

HEADROOM = 1.0625  # 1 + 2⁻⁴: P rounded to FP8 can exceed the softmax weight by that factor


def output_scale(v: torch.Tensor) -> torch.Tensor:
    """(B,) float32: ``HEADROOM`` · max |V[b]| / 448, i.e. the largest per-tile V scale of each batch
    whatever the tile (the kernel takes it from those scales)."""
    amax = v.float().abs().amax(dim=(1, 2, 3)).clamp(min=1e-12)
    return amax / FP8_MAX * HEADROOM


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None,
              scale: float | None = None, block_n: int = attention.SPEC_BLOCK_N
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Spec: (o8 (B, H, S_q, D) float8_e4m3fn, row scales (B, S_q) float32), from the float32 output
    of :func:`kopt.kernels.fp8_attention.reference` (computed here without its final rounding)."""
    out = attention.reference(q.float(), k.float(), v.float(), bias, scale, block_n)
    s_o = output_scale(v)
    o8 = (out / s_o[:, None, None, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return o8, s_o[:, None].expand(q.shape[0], q.shape[2]).contiguous()


@torch.library.custom_op("kopt::fp8_attention_quant", mutates_args=())
def fp8_attention_quant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                        scale: float, bias_start: int = 0, bias_end: int = -1,
                        v_tail: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``kopt::fp8_attention`` with an FP8 output and its row scales; Triton on CUDA, the spec elsewhere."""
    window = (bias_start, k.shape[2] if bias_end < 0 else bias_end)
    if q.is_cuda:
        return attention.launch(q, k, v, bias, scale, bias_window=window, fp8_out=True, v_tail=v_tail)
    attention.check(q, k, v, bias, scale, v_tail)
    o8, row_scale = reference(q, k, v if v_tail is None else torch.cat([v, v_tail], dim=2), bias, scale)
    return attention.empty_output(q, FP8).copy_(o8), row_scale


@fp8_attention_quant.register_fake
def _(q, k, v, bias, scale, bias_start=0, bias_end=-1, v_tail=None):
    return attention.empty_output(q, FP8), q.new_empty((q.shape[0], q.shape[2]), dtype=torch.float32)
