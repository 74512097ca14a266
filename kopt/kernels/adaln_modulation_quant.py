"""adaLN modulation that emits FP8: ``q, s = quantize_rows(norm(x) * (1 + scale) + shift)``.

The modulated norm of a DiT block feeds only its (merged) Q/K/V or MLP-up projection. When that
projection is an FP8 GEMM, the bf16 value exists only to be quantized: here the row kernel of
:mod:`adaln_modulation` (the whole row in registers) rounds it to x.dtype as the unfused graph
does, takes the row's amax, and writes the FP8 values and one float32 scale per row. The bf16
tensor is never written and never read back.

Same spec as ``adaln_modulation.reference`` followed by :func:`kopt.fp8.quantize.quantize` (ROW).
Bytes moved (memory floor): read ``B*S*N*e + 2*B*N*m``, write ``B*S*N`` (fp8) + ``4*B*S``; at the
production shape (1, 4096, 3072) bf16 that is 25.2 + 12.6 MB, half the bf16 kernel's write.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kopt.fp8.config import Granularity
from kopt.fp8.quantize import FP8, quantize
from kopt.kernels import _autotune
from kopt.kernels import adaln_modulation as _bf16
from kopt.kernels._autotune import Config, pow2_bucket, shape_key
from kopt.kernels._pdl import begin, launch_options
from kopt.kernels._rows import (
    DTYPES,
    layer_norm_rows,
    modulate_rows,
    modulation_rows,
    one_batch,
    row_candidates,
    row_tile,
    store_fp8_rows,
)

__all__ = ["adaln_modulation_quant", "launch", "reference"]


def reference(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor | None = None,
              eps: float = 1e-6, rms: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager spec: the bf16 kernel's spec (rounded to x.dtype), then row-wise FP8; q is (B*S, N)."""
    y = _bf16.reference(x, scale, shift, weight, eps, rms)
    return quantize(y.reshape(-1, y.shape[-1]), Granularity.ROW)


@triton.jit
def _adaln_modulation_quant_kernel(x_ptr, scale_ptr, shift_ptr, weight_ptr, q_ptr, s_ptr, n_rows, S, N,
                                   stride_scale_b, stride_shift_b, eps, IS_RMS: tl.constexpr,
                                   HAS_WEIGHT: tl.constexpr, ONE_BATCH: tl.constexpr,
                                   ROWS_PER_PROGRAM: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    begin(PDL)
    offsets, mask, cols, batch, mod_mask = row_tile(S, N, n_rows, ROWS_PER_PROGRAM, BLOCK_N, ONE_BATCH)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if IS_RMS:
        normed = x * tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)[:, None]
        if HAS_WEIGHT:
            normed = normed * tl.load(weight_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    else:
        normed = layer_norm_rows(x, mask, N, eps)
    y = modulate_rows(normed, scale_ptr, stride_scale_b, shift_ptr, stride_shift_b, batch, cols, mod_mask)
    y = y.to(x_ptr.dtype.element_ty).to(tl.float32)  # the graph's rounding
    store_fp8_rows(y, mask, q_ptr, s_ptr, offsets, n_rows, ROWS_PER_PROGRAM)


def launch(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor | None = None,
           eps: float = 1e-6, rms: bool = False, *, config: Config | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kernel: (q (B*S, N) float8_e4m3fn, scales (B*S, 1) float32); config as in adaln_modulation."""
    if x.dim() != 3 or x.dtype not in DTYPES:
        raise ValueError(f"adaln_modulation_quant: x must be a (B, S, N) float tensor, got {x.dtype} {tuple(x.shape)}")
    b, s, n = x.shape
    x = x.contiguous()
    scale = modulation_rows(scale, "scale", "adaln_modulation_quant", b, n)
    shift = modulation_rows(shift, "shift", "adaln_modulation_quant", b, n)
    if weight is not None:
        if not rms or tuple(weight.shape) != (n,):
            raise ValueError(f"adaln_modulation_quant: weight must be ({n},) and only with rms=True")
        weight = weight.contiguous()
    n_rows = b * s
    q = torch.empty((n_rows, n), dtype=FP8, device=x.device)
    scales = torch.empty((n_rows, 1), dtype=torch.float32, device=x.device)
    if n_rows == 0:
        return q, scales

    def run(cfg: Config, q_dst: torch.Tensor, s_dst: torch.Tensor) -> None:
        _adaln_modulation_quant_kernel[(triton.cdiv(n_rows, cfg["ROWS_PER_PROGRAM"]),)](
            x, scale, shift, weight if weight is not None else x, q_dst, s_dst, n_rows, s, n,
            scale.stride(0), shift.stride(0), float(eps), IS_RMS=bool(rms), HAS_WEIGHT=weight is not None,
            ONE_BATCH=one_batch(b, s, cfg), **cfg, **launch_options(x.device))

    rows = pow2_bucket(n_rows)
    key = shape_key(n=n, rows=rows, dtype=x.dtype, rms=rms, weight=weight is not None)
    _autotune.launch_tuned("adaln_modulation_quant", key, row_candidates(n, rows), run, (q, scales), x.device, config)
    return q, scales


@torch.library.custom_op("kopt::adaln_modulation_quant", mutates_args=())
def adaln_modulation_quant(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                           weight: torch.Tensor | None = None, eps: float = 1e-6, rms: bool = False
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise FP8 ``norm(x) * (1 + scale) + shift`` and its scales; Triton on CUDA, the reference elsewhere."""
    if x.is_cuda:
        return launch(x, scale, shift, weight, eps, rms)
    q, scales = reference(x, scale, shift, weight, eps, rms)
    return q.contiguous(), scales.contiguous()


@adaln_modulation_quant.register_fake
def _(x, scale, shift, weight=None, eps=1e-6, rms=False):
    rows = x.numel() // x.shape[-1]
    return x.new_empty((rows, x.shape[-1]), dtype=FP8), x.new_empty((rows, 1), dtype=torch.float32)
