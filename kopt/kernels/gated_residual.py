"""Gated residual fused with the next LayerNorm + adaLN modulation, two outputs in one pass.

Inputs: residual ``r`` and branch output ``y``, both (B, S, N) bf16/fp16/fp32 of one dtype, or a
float32 residual stream ``r`` with a bf16/fp16 ``y`` (the ``residual-fp32`` pass);
``gate``, ``scale`` and ``shift`` of shape (B, N) or (B, 1, N), broadcast over S; ``gate`` may be
None (a plain residual add). Computes::

    r_new = r + gate * y          (r + y without a gate)   # rounded to r.dtype
    m     = norm(r_new) * (1 + scale) + shift              # y.dtype
    norm  = LayerNorm without affine, or RMSNorm without weight with ``rms`` (LTX-Video's form)

This is the seam between sub-blocks in Qwen-Image (``hidden_states + img_gate1 * img_attn_output``
then ``img_norm2`` + ``_modulate``) and FLUX.2 (``hidden_states + gate_msa * attn_output`` then
``norm2`` + ``(1 + scale_mlp) * norm + shift_mlp``). Arithmetic is float32. ``r_new`` is rounded to
``r.dtype`` *before* it is normalized, as eager does when it stores the residual, so ``m`` is
consistent with the residual stream that the next block reads; ``m`` is rounded once to ``r.dtype``.
Without a gate (LTX-Video's ``hidden_states + attn_output`` of the cross-attention before ``norm2``)
the kernel is compiled with ``HAS_GATE=False``: no gate is loaded or multiplied (``1 * y`` would be
exact, but a tensor of ones would cost a graph node and a load per program for nothing).

Bytes moved (the memory floor), ``e`` bytes per element of r/y and ``m`` of gate/scale/shift:
read ``2*B*S*N*e + 3*B*N*m`` (``2*B*N*m`` without a gate), write ``2*B*S*N*e``. For bf16:
``8*B*S*N + 6*B*N`` bytes; at the production shape (1, 4096, 3072) that is 100.7 MB, about 21 us at
4.8 TB/s (H200). Unfused, the same work reads/writes r_new twice more (the add's write, the norm's
read) plus the modulation round trip.
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
    gated_residual_rows,
    modulate_rows,
    modulation_rows,
    one_batch,
    row_candidates,
    row_tile,
)

__all__ = ["candidates", "gated_residual", "launch", "reference"]

# y's dtype for each residual dtype: the same, or a lower-precision branch on a float32 stream
_BRANCH_DTYPES = {torch.float16: (torch.float16,), torch.bfloat16: (torch.bfloat16,),
                  torch.float32: (torch.float32, torch.bfloat16, torch.float16)}


# ----------------------------------------------------------------------------------------------- spec
def reference(
    r: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor | None,
    scale: torch.Tensor,
    shift: torch.Tensor,
    eps: float = 1e-6,
    rms: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager spec: float32 gated add (a plain add when ``gate`` is None; rounded to r.dtype), float32
    LayerNorm (RMSNorm with ``rms``) + modulation (to y.dtype)."""
    b, n = r.shape[0], r.shape[-1]
    scale_f = scale.float().reshape(b, 1, n)
    shift_f = shift.float().reshape(b, 1, n)
    branch = y.float() if gate is None else gate.float().reshape(b, 1, n) * y.float()
    r_new = (r.float() + branch).to(r.dtype)
    wide = r_new.float()
    normed = (wide * torch.rsqrt(wide.square().mean(-1, keepdim=True) + eps) if rms
              else torch.nn.functional.layer_norm(wide, (n,), eps=eps))
    m = (normed * (1.0 + scale_f) + shift_f).to(y.dtype)
    return r_new, m


# --------------------------------------------------------------------------------------------- kernel
@triton.jit
def _gated_residual_kernel(
    r_ptr,
    y_ptr,
    gate_ptr,
    scale_ptr,
    shift_ptr,
    r_out_ptr,
    m_out_ptr,
    n_rows,
    S,
    N,
    stride_gate_b,
    stride_scale_b,
    stride_shift_b,
    eps,
    IS_RMS: tl.constexpr,
    HAS_GATE: tl.constexpr,
    ONE_BATCH: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    begin(PDL)
    # One program per ROWS_PER_PROGRAM rows of the flattened (B*S, N) inputs; per-row reductions on axis 1.
    offsets, mask, cols, batch, mod_mask = row_tile(S, N, n_rows, ROWS_PER_PROGRAM, BLOCK_N, ONE_BATCH)
    normed = gated_residual_rows(r_ptr, y_ptr, gate_ptr, r_out_ptr, offsets, mask, cols, batch, mod_mask,
                                 stride_gate_b, N, eps, IS_RMS, HAS_GATE)
    m = modulate_rows(normed, scale_ptr, stride_scale_b, shift_ptr, stride_shift_b, batch, cols, mod_mask)
    tl.store(m_out_ptr + offsets, m.to(m_out_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------------------------- launcher
def candidates(n: int, rows: int) -> list[Config]:
    """Candidate launch configs for rows of ``n`` and ``rows`` rows (bucketed); the first is the default."""
    return row_candidates(n, rows)


def _check_out(t: torch.Tensor | None, name: str, like: torch.Tensor) -> torch.Tensor:
    if t is None:
        return torch.empty_like(like, memory_format=torch.contiguous_format)
    if t.shape != like.shape or t.dtype != like.dtype or not t.is_contiguous() or t.device != like.device:
        raise ValueError(
            f"gated_residual: {name} must be contiguous {tuple(like.shape)} {like.dtype} on {like.device}, "
            f"got {tuple(t.shape)} {t.dtype} contiguous={t.is_contiguous()} on {t.device}"
        )
    return t


def launch(
    r: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor | None,
    scale: torch.Tensor,
    shift: torch.Tensor,
    eps: float = 1e-6,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    config: Config | None = None,
    rms: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the Triton kernel; returns ``(r_new, m)`` (``out`` when given, else fresh contiguous);
    ``rms`` normalizes with RMSNorm instead of LayerNorm; ``gate=None`` adds ``y`` ungated.

    ``config`` forces a launch config (one of ``candidates``); by default the autotuner picks it."""
    if r.dim() != 3:
        raise ValueError(f"gated_residual: r must be (B, S, N), got shape {tuple(r.shape)}")
    if r.dtype not in DTYPES:
        raise ValueError(f"gated_residual: r dtype must be one of {DTYPES}, got {r.dtype}")
    if y.shape != r.shape or y.dtype not in _BRANCH_DTYPES[r.dtype]:
        raise ValueError(f"gated_residual: y must be shaped like r {tuple(r.shape)} and of its dtype {r.dtype} "
                         f"(or bf16/fp16 with a float32 r), got {tuple(y.shape)} {y.dtype}")
    b, s, n = r.shape
    r = r.contiguous()
    y = y.contiguous()
    gate = None if gate is None else modulation_rows(gate, "gate", "gated_residual", b, n)
    scale = modulation_rows(scale, "scale", "gated_residual", b, n)
    shift = modulation_rows(shift, "shift", "gated_residual", b, n)
    for name, t in (("y", y), ("gate", gate), ("scale", scale), ("shift", shift)):
        if t is not None and t.device != r.device:
            raise ValueError(f"gated_residual: {name} is on {t.device}, r on {r.device}")
    r_out = _check_out(out[0] if out is not None else None, "out[0]", r)
    m_out = _check_out(out[1] if out is not None else None, "out[1]", y)
    if r.numel() == 0:
        return r_out, m_out
    n_rows = b * s

    def run(cfg: Config, dst_r: torch.Tensor, dst_m: torch.Tensor) -> None:
        grid = (triton.cdiv(n_rows, cfg["ROWS_PER_PROGRAM"]),)
        _gated_residual_kernel[grid](
            r,
            y,
            scale if gate is None else gate,  # never read without a gate
            scale,
            shift,
            dst_r,
            dst_m,
            n_rows,
            s,
            n,
            0 if gate is None else gate.stride(0),
            scale.stride(0),
            shift.stride(0),
            float(eps),
            IS_RMS=bool(rms),
            HAS_GATE=gate is not None,
            ONE_BATCH=one_batch(b, s, cfg),
            **cfg, **launch_options(r.device)
        )

    rows = pow2_bucket(n_rows)
    key = shape_key(n=n, rows=rows, dtype=r.dtype, **({} if y.dtype == r.dtype else {"y": y.dtype}),
                    **({"rms": 1} if rms else {}), **({} if gate is not None else {"gate": 0}))
    _autotune.launch_tuned("gated_residual", key, candidates(n, rows), run, (r_out, m_out), r.device, config)
    return r_out, m_out


# ---------------------------------------------------------------------------------------- custom op
@torch.library.custom_op("kopt::gated_residual", mutates_args=())
def gated_residual(
    r: torch.Tensor,
    y: torch.Tensor,
    gate: torch.Tensor | None,
    scale: torch.Tensor,
    shift: torch.Tensor,
    eps: float = 1e-6,
    rms: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r + gate*y, norm(r + gate*y) * (1 + scale) + shift)`` (``r + y`` when ``gate`` is None), norm
    a LayerNorm or (``rms``) an RMSNorm; Triton on CUDA, else reference."""
    if r.is_cuda:
        return launch(r, y, gate, scale, shift, eps, rms=rms)
    r_new, m = reference(r, y, gate, scale, shift, eps, rms)
    return r_new.contiguous(), m.contiguous()


@gated_residual.register_fake
def _(r, y, gate, scale, shift, eps=1e-6, rms=False):
    return (
        torch.empty_like(r, memory_format=torch.contiguous_format),
        torch.empty_like(y, memory_format=torch.contiguous_format),
    )
