"""Helpers shared by the row-wise kernels (one program normalizes one row of N values): launch
configuration and argument checks on the host, norm and modulation on the device."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_CONFIGS: dict[tuple[int, torch.dtype], tuple[int, int]] = {}


def row_config(n: int, dtype: torch.dtype) -> tuple[int, int]:
    """(BLOCK_N, num_warps) for a row of ``n`` elements: the whole row in one block, more warps for
    wider rows so each thread holds at most ~16 values; cached per (n, dtype)."""
    key = (n, dtype)
    if key not in _CONFIGS:
        block_n = triton.next_power_of_2(n)
        num_warps = 4 if n <= 2048 else 8 if n <= 8192 else 16
        _CONFIGS[key] = (block_n, num_warps)
    return _CONFIGS[key]


def modulation_rows(t: torch.Tensor, name: str, op: str, b: int, n: int) -> torch.Tensor:
    """View a (B, N) or (B, 1, N) modulation tensor as (B, N) with unit last-dim stride.

    A ``chunk()`` of a (B, 6N) projection keeps its row stride, so no copy is made for it."""
    if t.dtype not in DTYPES:
        raise ValueError(f"{op}: {name} dtype must be one of {DTYPES}, got {t.dtype}")
    if tuple(t.shape) not in ((b, n), (b, 1, n)):
        raise ValueError(f"{op}: {name} must have shape ({b}, {n}) or ({b}, 1, {n}), got {tuple(t.shape)}")
    t = t.reshape(b, n)
    return t if t.stride(-1) == 1 else t.contiguous()


# ---------------------------------------------------------------- device helpers shared by the kernels
@triton.jit
def layer_norm_row(x, mask, N, eps):
    """LayerNorm (no affine) of one float32 row held in registers; masked lanes stay zero."""
    mean = tl.sum(x, axis=0) / N
    diff = tl.where(mask, x - mean, 0.0)
    var = tl.sum(diff * diff, axis=0) / N
    return diff * tl.rsqrt(var + eps)


@triton.jit
def modulate_row(normed, scale_row_ptr, shift_row_ptr, cols, mask):
    """``normed * (1 + scale) + shift`` with this row's (B, N) modulation vectors, in float32."""
    scale = tl.load(scale_row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    shift = tl.load(shift_row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return normed * (1.0 + scale) + shift
