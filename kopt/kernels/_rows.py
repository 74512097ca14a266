"""Helpers shared by the row-wise kernels (a program normalizes ROWS_PER_PROGRAM rows of N values,
held as a [ROWS_PER_PROGRAM, BLOCK_N] tile): candidate launch configurations and argument checks on
the host, norm and modulation on the device."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kopt.kernels._autotune import Config

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_WARPS = (2, 4, 8, 16)
_ROWS = (1, 2, 4, 8, 16, 32)


def default_row_warps(n: int) -> int:
    """The heuristic num_warps for one row per program: each thread holds at most ~16 values."""
    return 4 if n <= 2048 else 8 if n <= 8192 else 16


def row_candidates(n: int, rows: int) -> list[Config]:
    """Candidate configs for rows of ``n`` elements and ``rows`` rows (a power-of-two bucket).

    First the heuristic default (one row per program, ``default_row_warps``), then every
    (ROWS_PER_PROGRAM, num_warps) with 4..32 float32 values of the tile per thread and no more rows
    per program than there are rows. BLOCK_N is the whole row rounded up to a power of two."""
    return [dict(c) for c in _row_candidates(n, triton.next_power_of_2(max(rows, 1)))]


@functools.cache
def _row_candidates(n: int, rows: int) -> tuple[Config, ...]:
    block_n = triton.next_power_of_2(n)
    default = {"ROWS_PER_PROGRAM": 1, "BLOCK_N": block_n, "num_warps": default_row_warps(n)}
    out = [default]
    for r in _ROWS:
        if r > max(rows, 1):
            break
        for w in _WARPS:
            per_thread = r * block_n // (32 * w)
            config = {"ROWS_PER_PROGRAM": r, "BLOCK_N": block_n, "num_warps": w}
            if 4 <= per_thread <= 32 and config not in out:
                out.append(config)
    return tuple(out)


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
def row_tile(S, N, n_rows, ROWS_PER_PROGRAM: tl.constexpr, BLOCK_N: tl.constexpr, ONE_BATCH: tl.constexpr):
    """This program's tile of the flattened (B*S, N) rows: element offsets [R, BLOCK_N], the tile mask,
    the column indices, and the batch index with the mask for the (B, N) modulation vectors.

    ONE_BATCH (all rows of a program in one batch: B == 1 or S % ROWS_PER_PROGRAM == 0): the batch
    is a scalar and a modulation vector is loaded once as [1, BLOCK_N] and broadcast over the rows;
    otherwise it is gathered per row as [R, BLOCK_N] (batch has shape [R, 1])."""
    first = tl.program_id(0).to(tl.int64) * ROWS_PER_PROGRAM
    rows = first + tl.arange(0, ROWS_PER_PROGRAM)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows < n_rows)[:, None] & col_mask[None, :]
    offsets = rows[:, None] * N + cols[None, :]
    if ONE_BATCH:
        batch = first // S
        mod_mask = col_mask[None, :]
    else:
        batch = (rows // S)[:, None]
        mod_mask = mask
    return offsets, mask, cols, batch, mod_mask


@triton.jit
def load_modulation(ptr, stride_b, batch, cols, mod_mask):
    """This tile's rows of a (B, N) modulation tensor in float32 ([1, BLOCK_N] or [R, BLOCK_N])."""
    return tl.load(ptr + batch * stride_b + cols[None, :], mask=mod_mask, other=0.0).to(tl.float32)


@triton.jit
def layer_norm_rows(x, mask, N, eps):
    """LayerNorm (no affine) of each row of a float32 [R, BLOCK_N] tile; masked lanes stay zero."""
    mean = tl.sum(x, axis=1) / N
    diff = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(diff * diff, axis=1) / N
    return diff * tl.rsqrt(var + eps)[:, None]


@triton.jit
def rms_norm_rows(x, N, eps):
    """RMSNorm (no weight) of each row of a float32 [R, BLOCK_N] tile; masked lanes are zero already."""
    return x * tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)[:, None]


@triton.jit
def modulate_rows(normed, scale_ptr, stride_scale_b, shift_ptr, stride_shift_b, batch, cols, mod_mask):
    """``normed * (1 + scale) + shift`` in float32, the tile's scale and shift rows loaded here (per
    batch, broadcast over its rows)."""
    scale = load_modulation(scale_ptr, stride_scale_b, batch, cols, mod_mask)
    shift = load_modulation(shift_ptr, stride_shift_b, batch, cols, mod_mask)
    return normed * (1.0 + scale) + shift


def one_batch(b: int, s: int, config: Config) -> bool:
    """Whether every program's rows lie in one batch, so modulation vectors load once per program."""
    return b == 1 or s % config["ROWS_PER_PROGRAM"] == 0


@triton.jit
def fp8_scale(amax):
    """The scale of a group whose largest magnitude is ``amax``: ``max(amax, 1e-12) / 448``, as
    kopt.fp8.quantize defines it (the amax maps to e4m3's largest finite value)."""
    return tl.maximum(amax, 1e-12) / 448.0


@triton.jit
def fp8_values(x, scale):
    """``x / scale`` clamped to ±448, in float32: ready to be cast to float8_e4m3fn. Computed as
    ``x · (1 / scale)`` with one reciprocal per scale (per row): a division per element costs a
    special-function instruction and its range guards, and these kernels are bound by instruction
    issue. The product is within 1.5 ulp of the quotient (Triton's ``/`` is ``div.full``, 2 ulp), so
    an FP8 value can differ only where x / scale lies within that of a rounding boundary.

    A NaN stays NaN, as through torch's clamp (Triton's min/max would drop it and write ±448, a finite
    value no one would notice); the GEMM then carries it to the output. The scale is that of the
    row's other values (the amax reductions skip NaN), where torch's amax would make the whole row
    NaN: either way the NaN reaches the model's output. Same instruction count (``max.NaN``)."""
    clamped_below = tl.maximum(x * (1.0 / scale), -448.0, propagate_nan=tl.PropagateNan.ALL)
    return tl.minimum(clamped_below, 448.0, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def fp8_rows(x):
    """Row-wise FP8 of a float32 [R, C] tile: (values in float32, one scale per row)."""
    scale = fp8_scale(tl.max(tl.abs(x), axis=1))
    return fp8_values(x, scale[:, None]), scale


@triton.jit
def store_fp8_rows(y, mask, q_ptr, s_ptr, offsets, n_rows, ROWS_PER_PROGRAM: tl.constexpr):
    """Row-wise FP8 of a float32 [R, BLOCK_N] tile, as kopt.fp8.quantize (ROW) defines it: one scale
    ``max(amax(|row|), 1e-12) / 448`` per row (stored at ``s_ptr + row``), values clamped to ±448."""
    q, row_scale = fp8_rows(tl.where(mask, y, 0.0))
    tl.store(q_ptr + offsets, q.to(q_ptr.dtype.element_ty), mask=mask)
    rows = tl.program_id(0).to(tl.int64) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    tl.store(s_ptr + rows, row_scale, mask=rows < n_rows)


@triton.jit
def gated_residual_rows(r_ptr, y_ptr, gate_ptr, r_out_ptr, offsets, mask, cols, batch, mod_mask, stride_gate_b, N, eps,
                        IS_RMS: tl.constexpr, HAS_GATE: tl.constexpr):
    """``r + gate * y`` (``r + y`` without ``HAS_GATE``: ``gate_ptr`` is never read) for a tile, rounded
    to the residual dtype and stored (the residual stream eager keeps), and the LayerNorm (RMSNorm with
    ``IS_RMS``) of that rounded value (what eager's next norm reads), in float32."""
    r = tl.load(r_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if HAS_GATE:
        y = y * load_modulation(gate_ptr, stride_gate_b, batch, cols, mod_mask)
    r_new = (r + y).to(r_out_ptr.dtype.element_ty)
    tl.store(r_out_ptr + offsets, r_new, mask=mask)
    if IS_RMS:
        return rms_norm_rows(r_new.to(tl.float32), N, eps)
    return layer_norm_rows(r_new.to(tl.float32), mask, N, eps)
