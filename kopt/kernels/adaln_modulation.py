"""adaLN modulation: ``y = norm(x) * (1 + scale) + shift``, one fused pass.

Shapes: ``x`` is (B, S, N) in bf16/fp16/fp32; ``scale`` and ``shift`` are (B, N) or (B, 1, N) and
broadcast over S. ``norm`` is over the last dim and is one of

* LayerNorm without affine (``rms=False``): ``(x - mean) * rsqrt(var + eps)``, biased variance, the
  ``nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)`` that Qwen-Image (``img_norm1/2``,
  ``txt_norm1/2`` then ``_modulate``) and FLUX.2 (``norm1/norm2[_context]`` then
  ``(1 + scale) * norm + shift``) use before attention and the MLP;
* RMSNorm (``rms=True``): ``x * rsqrt(mean(x**2) + eps)``, times ``weight`` (N,) when given.

All arithmetic is float32; the result is rounded once to ``x.dtype``. (Diffusers' eager bf16 path
rounds the norm output to bf16 before modulating, so it differs from this spec by ~1 bf16 ulp.)

Bytes moved (the memory floor), with ``e`` bytes per element of x and ``m`` of scale/shift:
read ``B*S*N*e + 2*B*N*m`` (+ ``N*w`` for an RMS weight), write ``B*S*N*e``.
For bf16 x and bf16 modulation: ``4*B*S*N + 4*B*N`` bytes; at the production shape
(1, 4096, 3072) that is 50.3 MB + 12 KB, i.e. about 10.5 us at 4.8 TB/s (H200).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kopt.kernels import _autotune
from kopt.kernels._autotune import Config, pow2_bucket, shape_key
from kopt.kernels._pdl import begin, launch_options
from kopt.kernels._rows import (
    DTYPES,
    layer_norm_rows,
    modulate_rows,
    modulation_rows,
    one_batch,
    rms_norm_rows,
    row_candidates,
    row_tile,
)

__all__ = ["adaln_modulation", "candidates", "launch", "reference"]

# ----------------------------------------------------------------------------------------------- spec
def reference(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    rms: bool = False,
) -> torch.Tensor:
    """Eager spec: float32 norm over the last dim, modulation, one rounding to ``x.dtype``."""
    xf = x.float()
    if rms:
        normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
        if weight is not None:
            normed = normed * weight.float()
    else:
        normed = torch.nn.functional.layer_norm(xf, (xf.shape[-1],), eps=eps)
    b, n = x.shape[0], x.shape[-1]
    scale_f = scale.float().reshape(b, 1, n)
    shift_f = shift.float().reshape(b, 1, n)
    return (normed * (1.0 + scale_f) + shift_f).to(x.dtype)


# --------------------------------------------------------------------------------------------- kernel
@triton.jit
def _adaln_modulation_kernel(
    x_ptr,
    scale_ptr,
    shift_ptr,
    weight_ptr,
    out_ptr,
    n_rows,
    S,
    N,
    stride_scale_b,
    stride_shift_b,
    eps,
    IS_RMS: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    ONE_BATCH: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    begin(PDL)
    # One program per ROWS_PER_PROGRAM rows of the flattened (B*S, N) input; per-row reductions on axis 1.
    offsets, mask, cols, batch, mod_mask = row_tile(S, N, n_rows, ROWS_PER_PROGRAM, BLOCK_N, ONE_BATCH)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if IS_RMS:
        normed = rms_norm_rows(x, N, eps)
        if HAS_WEIGHT:
            w = tl.load(weight_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
            normed = normed * w[None, :]
    else:
        normed = layer_norm_rows(x, mask, N, eps)

    y = modulate_rows(normed, scale_ptr, stride_scale_b, shift_ptr, stride_shift_b, batch, cols, mod_mask)
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------------------------- launcher
def candidates(n: int, rows: int) -> list[Config]:
    """Candidate launch configs for rows of ``n`` and ``rows`` rows (bucketed); the first is the default."""
    return row_candidates(n, rows)


def launch(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    rms: bool = False,
    out: torch.Tensor | None = None,
    *,
    config: Config | None = None,
) -> torch.Tensor:
    """Run the Triton kernel; returns ``out`` (allocated contiguous when not given).

    ``config`` forces a launch config (one of ``candidates``); by default the autotuner picks it."""
    if x.dim() != 3:
        raise ValueError(f"adaln_modulation: x must be (B, S, N), got shape {tuple(x.shape)}")
    if x.dtype not in DTYPES:
        raise ValueError(f"adaln_modulation: x dtype must be one of {DTYPES}, got {x.dtype}")
    b, s, n = x.shape
    x = x.contiguous()
    scale = modulation_rows(scale, "scale", "adaln_modulation", b, n)
    shift = modulation_rows(shift, "shift", "adaln_modulation", b, n)
    if weight is not None:
        if not rms:
            raise ValueError("adaln_modulation: weight is only supported with rms=True (LayerNorm has no affine)")
        if tuple(weight.shape) != (n,) or weight.dtype not in DTYPES:
            raise ValueError(f"adaln_modulation: weight must be ({n},) float, got {tuple(weight.shape)} {weight.dtype}")
        weight = weight.contiguous()
    for name, t in (("scale", scale), ("shift", shift), ("weight", weight)):
        if t is not None and t.device != x.device:
            raise ValueError(f"adaln_modulation: {name} is on {t.device}, x on {x.device}")
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    elif out.shape != x.shape or out.dtype != x.dtype or not out.is_contiguous() or out.device != x.device:
        raise ValueError(
            f"adaln_modulation: out must be contiguous {tuple(x.shape)} {x.dtype} on {x.device}, "
            f"got {tuple(out.shape)} {out.dtype} contiguous={out.is_contiguous()} on {out.device}"
        )
    if x.numel() == 0:
        return out
    n_rows = b * s

    def run(cfg: Config, dst: torch.Tensor) -> None:
        grid = (triton.cdiv(n_rows, cfg["ROWS_PER_PROGRAM"]),)
        _adaln_modulation_kernel[grid](
            x,
            scale,
            shift,
            weight if weight is not None else x,  # dummy pointer, never read when HAS_WEIGHT=False
            dst,
            n_rows,
            s,
            n,
            scale.stride(0),
            shift.stride(0),
            float(eps),
            IS_RMS=bool(rms),
            HAS_WEIGHT=weight is not None,
            ONE_BATCH=one_batch(b, s, cfg),
            **cfg, **launch_options(x.device)
        )

    rows = pow2_bucket(n_rows)
    key = shape_key(n=n, rows=rows, dtype=x.dtype, rms=rms, weight=weight is not None)
    _autotune.launch_tuned("adaln_modulation", key, candidates(n, rows), run, (out,), x.device, config)
    return out


# ---------------------------------------------------------------------------------------- custom op
@torch.library.custom_op("kopt::adaln_modulation", mutates_args=())
def adaln_modulation(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    rms: bool = False,
) -> torch.Tensor:
    """``norm(x) * (1 + scale) + shift``; the Triton kernel on CUDA, the reference elsewhere."""
    if x.is_cuda:
        return launch(x, scale, shift, weight, eps, rms)
    return reference(x, scale, shift, weight, eps, rms).contiguous()


@adaln_modulation.register_fake
def _(x, scale, shift, weight=None, eps=1e-6, rms=False):
    return torch.empty_like(x, memory_format=torch.contiguous_format)
