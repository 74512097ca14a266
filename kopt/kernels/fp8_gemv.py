"""A row-scaled FP8 GEMM with a handful of rows (a GEMV): the weight is streamed once.

    y = (q_x @ q_W.T) * scale_x * scale_W + bias         q_x (M, K), q_W (N, K) float8_e4m3fn,
                                                          scale_x (M, 1), scale_W (1, N) float32

the product ``torch._scaled_mm(q_x, q_W.t(), scale_x, scale_W, bias=bias, out_dtype=...)``
computes with row-wise scales. With M = 1 (a timestep embedding times every block's modulation
weights: Qwen-Image's 120 modulation linears, merged into one 2.2 M x 3072 GEMM) the work is
reading the weight: 6.8 GB, against 6 MFLOP, so its floor is the copy bandwidth; cuBLAS' GEMM
tiles, built for many rows, read it well below that.

Each program owns BLOCK_N output columns of one row of ``q_x``: it reads its BLOCK_N weight rows
BLOCK_K bytes at a time, multiplies them by the row's K values on the CUDA cores and keeps the
float32 products per lane, reducing them once at the end. Programs of one weight block for the M
rows are adjacent in the grid, so the second row's read of a weight block comes from L2.

Numerics: float32 accumulation of exact FP8 products (each product of two e4m3 values is exact in
float32), then the two scales and the bias in float32 and one rounding to ``out_dtype``. cuBLAS
with fast accumulation keeps shorter partial sums: this is the same value, closer to exact. The
launcher tunes the kernel's configs against cuBLAS itself (the ``CUBLAS`` config, the default when
nothing can be timed), so a device where cuBLAS is faster keeps it.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kopt.fp8.quantize import FP8
from kopt.kernels import _autotune
from kopt.kernels._autotune import Config, pow2_bucket, shape_key
from kopt.kernels._pdl import begin, launch_options

__all__ = ["MAX_ROWS", "candidates", "fp8_gemv", "launch", "reference"]

MAX_ROWS = 4  # more rows than this read the weight often enough for a GEMM tile to pay
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def reference(x: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
              bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """Eager spec in float32: ``(x @ weight.T) * x_scale * weight_scale (+ bias)``, rounded once."""
    y = (x.float() @ weight.float().t()) * x_scale.float() * weight_scale.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


@triton.jit
def _fp8_gemv_kernel(x_ptr, x_scale_ptr, w_ptr, w_scale_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_wn,
                     stride_om, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     K_STEPS: tl.constexpr, PDL: tl.constexpr):
    begin(PDL)
    pid = tl.program_id(0)
    m = pid % M  # the M programs of one weight block run side by side: the second read is from L2
    cols = (pid // M).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    partial = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    # K_STEPS is a constexpr (one compile per K): Triton's CPU interpreter cannot loop to a runtime bound.
    for step in range(0, K_STEPS):
        k = step * BLOCK_K + ks
        x = tl.load(x_ptr + m * stride_xm + k, mask=k < K, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols[:, None] * stride_wn + k[None, :], mask=(cols[:, None] < N) & (k[None, :] < K),
                    other=0.0).to(tl.float32)
        partial += w * x[None, :]
    acc = tl.sum(partial, axis=1)
    y = acc * tl.load(x_scale_ptr + m) * tl.load(w_scale_ptr + cols, mask=cols < N, other=0.0)
    if HAS_BIAS:
        y += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + cols, y.to(out_ptr.dtype.element_ty), mask=cols < N)


CUBLAS: Config = {"CUBLAS": 1}
_BLOCK_N = (16, 32, 64, 128)
_BLOCK_K = (128, 256, 512)
_WARPS = (4, 8)


@functools.cache
def _candidates() -> tuple[Config, ...]:
    kernel = tuple({"BLOCK_N": n, "BLOCK_K": k, "num_warps": w} for n in _BLOCK_N for k in _BLOCK_K for w in _WARPS
                   if 8 <= n * k // (32 * w) <= 64)  # float32 partial products a thread keeps
    return (CUBLAS, *kernel)


def candidates() -> list[Config]:
    """Launch configs: cuBLAS first (the default when nothing is timed), then every (BLOCK_N, BLOCK_K,
    num_warps) whose per-lane float32 partial products number 8..64 (fewer leaves too little in flight
    to stream the weight, more spills)."""
    return [dict(c) for c in _candidates()]


def _check(x: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
           bias: torch.Tensor | None, out_dtype: torch.dtype) -> tuple[int, int, int]:
    if x.dim() != 2 or weight.dim() != 2 or x.dtype != FP8 or weight.dtype != FP8 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"fp8_gemv: x (M, K) and weight (N, K) must be {FP8} with one K, got {x.dtype} "
                         f"{tuple(x.shape)} and {weight.dtype} {tuple(weight.shape)}")
    (m, k), n = x.shape, weight.shape[0]
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"fp8_gemv: x has {m} rows; it takes 1..{MAX_ROWS} (a GEMM tile pays for more)")
    if tuple(x_scale.shape) != (m, 1) or tuple(weight_scale.shape) != (1, n):
        raise ValueError(f"fp8_gemv: row-wise scales must be ({m}, 1) and (1, {n}), got {tuple(x_scale.shape)} "
                         f"and {tuple(weight_scale.shape)}")
    if x_scale.dtype != torch.float32 or weight_scale.dtype != torch.float32:
        raise ValueError(f"fp8_gemv: scales must be float32, got {x_scale.dtype} and {weight_scale.dtype}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"fp8_gemv: bias must have shape ({n},), got {tuple(bias.shape)}")
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"fp8_gemv: out_dtype must be one of {_OUT_DTYPES}, got {out_dtype}")
    return m, n, k


def launch(x: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
           bias: torch.Tensor | None, out_dtype: torch.dtype, fast_accum: bool = False, *,
           config: Config | None = None) -> torch.Tensor:
    """Run it: (M, N) of ``out_dtype``. ``fast_accum`` is what the cuBLAS config passes to
    ``_scaled_mm`` (the kernel always accumulates in float32). ``config`` forces a launch config
    (one of ``candidates``); by default the autotuner picks it."""
    m, n, k = _check(x, x_scale, weight, weight_scale, bias, out_dtype)
    x, weight = x.contiguous(), weight.contiguous()
    x_scale, weight_scale = x_scale.contiguous(), weight_scale.contiguous()
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)

    def run(cfg: Config, dst: torch.Tensor) -> None:
        if cfg.get("CUBLAS"):
            kwargs = {"bias": bias, "out_dtype": out_dtype}
            if fast_accum:
                kwargs["use_fast_accum"] = True
            dst.copy_(torch._scaled_mm(x, weight.t(), x_scale, weight_scale, **kwargs))
            return
        grid = (m * triton.cdiv(n, cfg["BLOCK_N"]),)
        _fp8_gemv_kernel[grid](x, x_scale, weight, weight_scale, bias if bias is not None else weight_scale, dst,
                               m, n, k, x.stride(0), weight.stride(0), dst.stride(0), HAS_BIAS=bias is not None,
                               BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], K_STEPS=triton.cdiv(k, cfg["BLOCK_K"]),
                               num_warps=cfg["num_warps"], **launch_options(x.device))

    key = shape_key(m=m, n=pow2_bucket(n), k=k, bias=bias is not None, out=out_dtype, fast_accum=fast_accum)
    _autotune.launch_tuned("fp8_gemv", key, candidates(), run, (out,), x.device, config)
    return out


@torch.library.custom_op("kopt::fp8_gemv", mutates_args=())
def fp8_gemv(x: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
             bias: torch.Tensor | None, out_dtype: torch.dtype, fast_accum: bool = False) -> torch.Tensor:
    """Row-scaled FP8 ``x @ weight.T`` for 1..MAX_ROWS rows; tuned against cuBLAS on CUDA, the spec elsewhere."""
    if x.is_cuda:
        return launch(x, x_scale, weight, weight_scale, bias, out_dtype, fast_accum)
    _check(x, x_scale, weight, weight_scale, bias, out_dtype)
    return reference(x, x_scale, weight, weight_scale, bias, out_dtype)


@fp8_gemv.register_fake
def _(x, x_scale, weight, weight_scale, bias, out_dtype, fast_accum=False):
    m, n, _ = _check(x, x_scale, weight, weight_scale, bias, out_dtype)
    return x.new_empty((m, n), dtype=out_dtype)
