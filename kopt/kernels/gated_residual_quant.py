"""Gated residual + LayerNorm + adaLN modulation that emits the modulated value in FP8.

    r_new = r + gate * y      (r + y without a gate)       # bf16, the residual stream (written)
    q, s  = quantize_rows(layernorm(r_new) * (1 + scale) + shift)   # FP8 + one scale per row

The seam between a DiT block's attention and its MLP (:mod:`gated_residual`) when the MLP's up
projection is an FP8 GEMM: the bf16 modulated value would exist only to be quantized. The row
kernel holds the whole row, so it rounds the modulated value to r.dtype as the bf16 op does, takes
the row amax and writes FP8 directly. ``gate=None`` compiles it with ``HAS_GATE=False``, as the bf16 op.

Same spec as ``gated_residual.reference`` followed by :func:`kopt.fp8.quantize.quantize` (ROW) of
``m``. Bytes moved (memory floor), bf16 at (1, 4096, 3072): read 50.3 MB (r, y), write 25.2 MB
(r_new) + 12.6 MB (FP8) — against 100.7 MB for the bf16 kernel plus 37.7 MB for a separate quantize.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kopt.fp8.config import Granularity
from kopt.fp8.quantize import FP8, quantize
from kopt.kernels import _autotune
from kopt.kernels import gated_residual as _bf16
from kopt.kernels._autotune import Config, pow2_bucket, shape_key
from kopt.kernels._pdl import begin, launch_options
from kopt.kernels._rows import (
    DTYPES,
    gated_residual_rows,
    modulate_rows,
    modulation_rows,
    one_batch,
    row_candidates,
    row_tile,
    store_fp8_rows,
)

__all__ = ["gated_residual_quant", "launch", "reference"]


def reference(r: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None, scale: torch.Tensor, shift: torch.Tensor,
              eps: float = 1e-6, rms: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eager spec: ``(r_new, q, s)`` with ``q, s`` the row-wise FP8 of the bf16 spec's ``m`` ((B*S, N))."""
    r_new, m = _bf16.reference(r, y, gate, scale, shift, eps, rms)
    q, s = quantize(m.reshape(-1, m.shape[-1]), Granularity.ROW)
    return r_new, q, s


@triton.jit
def _gated_residual_quant_kernel(r_ptr, y_ptr, gate_ptr, scale_ptr, shift_ptr, r_out_ptr, q_ptr, s_ptr, n_rows, S,
                                 N, stride_gate_b, stride_scale_b, stride_shift_b, eps, IS_RMS: tl.constexpr,
                                 HAS_GATE: tl.constexpr, ONE_BATCH: tl.constexpr,
                                 ROWS_PER_PROGRAM: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    begin(PDL)
    offsets, mask, cols, batch, mod_mask = row_tile(S, N, n_rows, ROWS_PER_PROGRAM, BLOCK_N, ONE_BATCH)
    normed = gated_residual_rows(r_ptr, y_ptr, gate_ptr, r_out_ptr, offsets, mask, cols, batch, mod_mask,
                                 stride_gate_b, N, eps, IS_RMS, HAS_GATE)
    m = modulate_rows(normed, scale_ptr, stride_scale_b, shift_ptr, stride_shift_b, batch, cols, mod_mask)
    m = m.to(r_out_ptr.dtype.element_ty).to(tl.float32)  # the bf16 op's m
    store_fp8_rows(m, mask, q_ptr, s_ptr, offsets, n_rows, ROWS_PER_PROGRAM)


def launch(r: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None, scale: torch.Tensor, shift: torch.Tensor,
           eps: float = 1e-6, *, config: Config | None = None,
           rms: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the kernel: (r_new (B, S, N), q (B*S, N) float8_e4m3fn, scales (B*S, 1) float32); ``rms``
    normalizes with RMSNorm instead of LayerNorm; ``gate=None`` adds ``y`` ungated."""
    if r.dim() != 3 or r.dtype not in DTYPES or y.shape != r.shape or y.dtype != r.dtype:
        raise ValueError(f"gated_residual_quant: r and y must be (B, S, N) float tensors of one dtype, got "
                         f"{r.dtype} {tuple(r.shape)} and {y.dtype} {tuple(y.shape)}")
    b, s, n = r.shape
    r, y = r.contiguous(), y.contiguous()
    gate = None if gate is None else modulation_rows(gate, "gate", "gated_residual_quant", b, n)
    scale = modulation_rows(scale, "scale", "gated_residual_quant", b, n)
    shift = modulation_rows(shift, "shift", "gated_residual_quant", b, n)
    n_rows = b * s
    r_out = torch.empty_like(r)
    q = torch.empty((n_rows, n), dtype=FP8, device=r.device)
    scales = torch.empty((n_rows, 1), dtype=torch.float32, device=r.device)
    if n_rows == 0:
        return r_out, q, scales

    def run(cfg: Config, *dst: torch.Tensor) -> None:
        _gated_residual_quant_kernel[(triton.cdiv(n_rows, cfg["ROWS_PER_PROGRAM"]),)](
            r, y, scale if gate is None else gate, scale, shift, *dst, n_rows, s, n,  # no gate: never read
            0 if gate is None else gate.stride(0), scale.stride(0), shift.stride(0),
            float(eps), IS_RMS=bool(rms), HAS_GATE=gate is not None, ONE_BATCH=one_batch(b, s, cfg), **cfg,
            **launch_options(r.device))

    rows = pow2_bucket(n_rows)
    key = shape_key(n=n, rows=rows, dtype=r.dtype, **({"rms": 1} if rms else {}),
                    **({} if gate is not None else {"gate": 0}))
    _autotune.launch_tuned("gated_residual_quant", key, row_candidates(n, rows), run, (r_out, q, scales), r.device,
                           config)
    return r_out, q, scales


@torch.library.custom_op("kopt::gated_residual_quant", mutates_args=())
def gated_residual_quant(r: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None, scale: torch.Tensor,
                         shift: torch.Tensor, eps: float = 1e-6,
                         rms: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(r + gate*y, fp8 rows of norm(r_new)*(1+scale)+shift, their scales)`` (``r + y`` when ``gate``
    is None), norm a LayerNorm or (``rms``) an RMSNorm; Triton on CUDA."""
    if r.is_cuda:
        return launch(r, y, gate, scale, shift, eps, rms=rms)
    r_new, q, scales = reference(r, y, gate, scale, shift, eps, rms)
    return r_new.contiguous(), q.contiguous(), scales.contiguous()


@gated_residual_quant.register_fake
def _(r, y, gate, scale, shift, eps=1e-6, rms=False):
    rows = r.numel() // r.shape[-1]
    return (torch.empty_like(r, memory_format=torch.contiguous_format), r.new_empty((rows, r.shape[-1]), dtype=FP8),
            r.new_empty((rows, 1), dtype=torch.float32))
