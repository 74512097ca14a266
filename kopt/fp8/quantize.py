"""FP8 quantization, the one definition every FP8 piece of kopt uses (pass, scan, tests).

``x ≈ q * scale`` with ``q = clamp(x / scale, ±448)`` in ``float8_e4m3fn`` and
``scale = max(amax(|x|), 1e-12) / 448`` over the granularity's group (the whole tensor, or each
row of the last dim). The amax maps to the largest finite e4m3 value, so nothing saturates; the
floor keeps an all-zero group from dividing by zero.
"""

from __future__ import annotations

import torch

from kopt.fp8.config import Granularity

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
MIN_AMAX = 1e-12


def quantize(x: torch.Tensor, granularity: Granularity) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): scale is (rows, 1) float32 for ROW, a 0-dim float32 for TENSOR."""
    xf = x.float()
    if granularity is Granularity.ROW:
        amax = xf.abs().amax(dim=-1, keepdim=True)
    elif granularity is Granularity.TENSOR:
        amax = xf.abs().amax()
    else:
        raise NotImplementedError(f"granularity {granularity.value}")
    scale = amax.clamp(min=MIN_AMAX) / FP8_MAX
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def fake_quantize(x: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """``dequantize(quantize(x))`` in x's dtype: the values an FP8 GEMM actually multiplies."""
    q, scale = quantize(x, granularity)
    return (q.float() * scale).to(x.dtype)
