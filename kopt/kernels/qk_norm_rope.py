"""QK RMSNorm + rotary embedding in one pass over q (or k).

Input ``x`` is (B, S, H, D): the Q (or K) projection right after ``unflatten(-1, (H, D))``, before
the transpose to (B, H, S, D). Per row (one token, one head) of D values, in float32::

    n = x * rsqrt(mean(x**2) + eps) * weight          # RMSNorm over D (weight optional)
    out[2i], out[2i+1] = rotate(n[2i], n[2i+1])        # RoPE on interleaved pairs

Two RoPE forms, both on interleaved pairs (x[2i], x[2i+1]) and both exact copies of diffusers:

* ``mode="complex"`` (Qwen-Image, ``apply_rotary_emb_qwen(..., use_real=False)``): the pair is a
  complex number multiplied by ``freqs_cis[s, i] = cos[s, i] + j*sin[s, i]``; ``cos``/``sin`` are
  (S, D/2). The launcher takes them as strided views: ``freqs_cis.real`` and ``freqs_cis.imag``
  (see ``cos_sin_from_complex``) are zero-copy views with stride 2, which the kernel reads
  directly, so nothing is concatenated, repeated or made contiguous on the hot path.
* ``mode="real"`` (FLUX.2, ``apply_rotary_emb(..., use_real=True, use_real_unbind_dim=-1)``):
  ``cos``/``sin`` are (S, D) (repeat-interleaved by diffusers) and
  ``out = n * cos + rot(n) * sin`` with ``rot(n)[2i] = -n[2i+1]``, ``rot(n)[2i+1] = n[2i]``.
  The kernel reads the full (S, D) tables, so it is exact for any table, interleaved or not.

Bytes moved (memory floor), with N = B*S*H*D elements of x and e = element size (2 for bf16)::

    bytes = 2 * N * e  (read x, write out)  +  D * e_w (weight)  +  T * 4 (fp32 tables)

with T = 2 * S * D/2 = S*D (complex) or 2 * S * D (real); the tables are shared across B and H
and stay in L2. bf16 Qwen-Image q (1, 4352, 24, 128): 2*13.4M*2 B = 53.5 MB (+ 2.2 MB of tables).
The unfused diffusers path moves x four to six times (norm read/write, complex view, float copy,
rotate, cast) and Inductor cannot fuse the complex multiply.
"""

import functools

import torch
import triton
import triton.language as tl

from kopt.kernels import _autotune
from kopt.kernels._autotune import Config, pow2_bucket, shape_key
from kopt.kernels._pdl import begin, launch_options

__all__ = ["candidates", "cos_sin_from_complex", "launch", "launch_pair", "qk_norm_rope", "reference"]

_MODES = ("complex", "real")


def cos_sin_from_complex(freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, D/2) complex64 freqs -> (cos, sin) float32 (S, D/2) views, no copy (stride 2)."""
    if not freqs_cis.is_complex():
        raise ValueError(f"freqs_cis must be complex, got {freqs_cis.dtype}")
    return freqs_cis.real, freqs_cis.imag


# ----------------------------------------------------------------------------- reference (spec)
def reference(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    mode: str,
) -> torch.Tensor:
    """Eager spec: RMSNorm over D then RoPE, float32 compute, cast back to x.dtype."""
    xf = x.float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        n = n * weight.float()
    c = cos.float()[None, :, None, :]  # broadcast over B and H: x is (B, S, H, D)
    s = sin.float()[None, :, None, :]
    if mode == "complex":  # (a + ib)(c + is) on pairs, as apply_rotary_emb_qwen(use_real=False)
        a, b = n.reshape(*n.shape[:-1], -1, 2).unbind(-1)
        out = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
    elif mode == "real":  # as apply_rotary_emb(use_real=True, use_real_unbind_dim=-1)
        a, b = n.reshape(*n.shape[:-1], -1, 2).unbind(-1)
        rotated = torch.stack([-b, a], dim=-1).flatten(-2)
        out = n * c + rotated * s
    else:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    return out.to(x.dtype)


# ----------------------------------------------------------------------------- Triton kernel
@triton.jit
def _normalize_rotate_store(x_ptr, w_ptr, out_ptr, x_row, rows, cols, mask, D, eps, ce, co, se, so,
                            HAS_WEIGHT: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """One tensor's tile: load, RMSNorm over D, rotate the pairs by the loaded table values, store."""
    x = tl.load(x_ptr + x_row[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    # RMSNorm over D (masked lanes are zero and do not add to the sum).
    inv = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)
    x = x * inv[:, None]
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
        x = x * w[None, :]
    xe, xo = tl.split(tl.reshape(x, [ROWS_PER_PROGRAM, BLOCK_HALF, 2]))
    oe = xe * ce - xo * se
    oo = xo * co + xe * so
    out = tl.reshape(tl.join(oe, oo), [ROWS_PER_PROGRAM, 2 * BLOCK_HALF])  # re-interleave the pairs
    o_ptrs = out_ptr + rows[:, None] * D + cols[None, :]  # out is contiguous (B, S, H, D)
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(
    x_ptr,
    w_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    x2_ptr,
    w2_ptr,
    out2_ptr,
    n_rows,
    S,
    H,
    stride_xb,
    stride_xs,
    stride_xh,
    stride_x2b,
    stride_x2s,
    stride_x2h,
    stride_cs,
    stride_cd,
    stride_ss,
    stride_sd,
    half,
    eps,
    eps2,
    IS_COMPLEX: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_WEIGHT2: tl.constexpr,
    PAIR: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    ONE_TOKEN: tl.constexpr,
    PDL: tl.constexpr,
):
    begin(PDL)
    # One program: ROWS_PER_PROGRAM rows (token, head) x D columns. x and out move as contiguous row
    # tiles (vectorised loads/stores); pairs are split in registers: (R, D) -> (R, D/2, 2).
    # ONE_TOKEN (ROWS_PER_PROGRAM divides H): rows run head-fastest, so all of a program's rows are
    # heads of one token and share one row of the RoPE tables: it is loaded once, as [1, ...], and
    # broadcast, instead of once per head (1 KB of float32 tables per 256-byte bf16 row, FLUX.2's form).
    # PAIR: a second tensor of the same shape (K beside Q) rotated by the same tables: its tile is
    # normalized and rotated with the table values already loaded for the first, so the tables are
    # read once for both (LTX-Video's (S, 2048) float32 tables are 4x the bytes of a bf16 row).
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    row_mask = rows < n_rows
    h = rows % H
    s = (rows // H) % S
    token = s  # the RoPE table row of each tile row
    if ONE_TOKEN:
        token = ((pid * ROWS_PER_PROGRAM) // H) % S + tl.zeros([1], dtype=tl.int64)
    b = rows // (H * S)
    D = 2 * half
    cols = tl.arange(0, 2 * BLOCK_HALF)
    mask = row_mask[:, None] & (cols < D)[None, :]  # D is even: a pair is all in or all out
    j = tl.arange(0, BLOCK_HALF)

    if IS_COMPLEX:  # tables (S, D/2), any strides (e.g. the .real / .imag views): one (cos, sin) per pair
        pair_mask = (token[:, None] * 0 + j[None, :]) < half  # [1 or R, BLOCK_HALF]
        c = tl.load(cos_ptr + token[:, None] * stride_cs + j[None, :] * stride_cd, mask=pair_mask, other=0.0)
        sn = tl.load(sin_ptr + token[:, None] * stride_ss + j[None, :] * stride_sd, mask=pair_mask, other=0.0)
        ce = c.to(tl.float32)
        co = ce
        se = sn.to(tl.float32)
        so = se
    else:  # tables (S, D): one (cos, sin) per element
        table_mask = (token[:, None] * 0 + cols[None, :]) < D
        c = tl.load(cos_ptr + token[:, None] * stride_cs + cols[None, :] * stride_cd, mask=table_mask, other=0.0)
        sn = tl.load(sin_ptr + token[:, None] * stride_ss + cols[None, :] * stride_sd, mask=table_mask, other=0.0)
        ce, co = tl.split(tl.reshape(c.to(tl.float32), [c.shape[0], BLOCK_HALF, 2]))
        se, so = tl.split(tl.reshape(sn.to(tl.float32), [sn.shape[0], BLOCK_HALF, 2]))

    x_row = b * stride_xb + s * stride_xs + h * stride_xh
    _normalize_rotate_store(x_ptr, w_ptr, out_ptr, x_row, rows, cols, mask, D, eps, ce, co, se, so,
                            HAS_WEIGHT, ROWS_PER_PROGRAM, BLOCK_HALF)
    if PAIR:
        x2_row = b * stride_x2b + s * stride_x2s + h * stride_x2h
        _normalize_rotate_store(x2_ptr, w2_ptr, out2_ptr, x2_row, rows, cols, mask, D, eps2, ce, co, se, so,
                                HAS_WEIGHT2, ROWS_PER_PROGRAM, BLOCK_HALF)


# ----------------------------------------------------------------------------- launcher
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


_WARPS = (2, 4, 8, 16)
_ROWS = (1, 2, 4, 8, 16, 32, 64, 128)


def default_config(half: int, rows: int) -> Config:
    """The heuristic config: ~4096 elements per program for a row bucket of >= 8192, ~1024 otherwise."""
    block_half = triton.next_power_of_2(half)
    target = 2048 if rows >= 8192 else 512
    rows_per_program = max(1, min(64, target // block_half))
    elems = 2 * rows_per_program * block_half
    num_warps = 8 if elems >= 8192 else 4 if elems >= 2048 else 2
    return {"ROWS_PER_PROGRAM": rows_per_program, "BLOCK_HALF": block_half, "num_warps": num_warps}


@functools.cache
def _candidates(half: int, rows: int) -> tuple[Config, ...]:
    block_half = triton.next_power_of_2(half)
    out = [default_config(half, rows)]
    for r in _ROWS:
        if r > max(rows, 1):
            break
        for w in _WARPS:
            per_thread = 2 * r * block_half // (32 * w)
            config = {"ROWS_PER_PROGRAM": r, "BLOCK_HALF": block_half, "num_warps": w}
            if 4 <= per_thread <= 32 and config not in out:
                out.append(config)
    return tuple(out)


def candidates(half: int, rows: int) -> list[Config]:
    """Candidate configs for head dim ``2*half`` and ``rows`` = B*S*H rows (a power-of-two bucket):
    the heuristic default first, then every (ROWS_PER_PROGRAM, num_warps) with 4..32 float32 values of
    the [ROWS_PER_PROGRAM, D] tile per thread and no more rows per program than there are rows."""
    return [dict(c) for c in _candidates(half, pow2_bucket(rows))]


def _check_table(t: torch.Tensor, name: str, S: int, width: int, device: torch.device) -> None:
    if t.dim() != 2 or tuple(t.shape) != (S, width):
        raise ValueError(f"{name} must have shape ({S}, {width}), got {tuple(t.shape)}")
    if t.dtype != torch.float32:
        raise ValueError(f"{name} must be float32, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, x is on {device}")


def _checked_input(x: torch.Tensor, weight: torch.Tensor | None, name: str) -> torch.Tensor | None:
    """``weight`` made contiguous, after checking ``x`` (B, S, H, D) and ``weight`` (D,)."""
    if x.dim() != 4:
        raise ValueError(f"{name} must be (B, S, H, D), got shape {tuple(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"{name} dtype must be one of {_DTYPES}, got {x.dtype}")
    D = x.shape[3]
    if D % 2:
        raise ValueError(f"head dim D must be even for RoPE pairs, got {D}")
    if x.stride(3) != 1:
        raise ValueError(f"{name} must have unit stride on D, got strides {x.stride()}")
    if weight is None:
        return None
    if tuple(weight.shape) != (D,):
        raise ValueError(f"the weight of {name} must have shape ({D},), got {tuple(weight.shape)}")
    if weight.device != x.device:
        raise ValueError(f"the weight of {name} is on {weight.device}, {name} is on {x.device}")
    return weight.contiguous()


def _checked_out(out: torch.Tensor | None, x: torch.Tensor, name: str) -> torch.Tensor:
    if out is None:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(
            f"{name} must be a contiguous {x.dtype} tensor of shape {tuple(x.shape)}, "
            f"got {out.dtype} {tuple(out.shape)} strides {out.stride()}"
        )
    return out


def _launch(xs: tuple[torch.Tensor, ...], weights: tuple[torch.Tensor | None, ...], epss: tuple[float, ...],
            cos: torch.Tensor, sin: torch.Tensor, mode: str, outs: tuple[torch.Tensor | None, ...],
            config: Config | None) -> tuple[torch.Tensor, ...]:
    """One launch for one tensor, or for two of one shape (``PAIR``) rotated by the same tables."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    names = ("x", "x2")[:len(xs)]
    weights = tuple(_checked_input(x, w, name) for x, w, name in zip(xs, weights, names, strict=True))
    x = xs[0]
    if len(xs) == 2 and (xs[1].shape != x.shape or xs[1].dtype != x.dtype or xs[1].device != x.device):
        raise ValueError(f"a pair must agree on shape, dtype and device: x {tuple(x.shape)} {x.dtype} {x.device}, "
                         f"x2 {tuple(xs[1].shape)} {xs[1].dtype} {xs[1].device}")
    B, S, H, D = x.shape
    half = D // 2
    width = half if mode == "complex" else D
    _check_table(cos, "cos", S, width, x.device)
    _check_table(sin, "sin", S, width, x.device)
    outs = tuple(_checked_out(o, xi, f"out of {name}") for o, xi, name in zip(outs, xs, names, strict=True))
    n_rows = B * S * H
    if n_rows == 0:
        return outs
    pair = len(xs) == 2
    x2, w2, eps2 = (xs[1], weights[1], epss[1]) if pair else (x, None, 0.0)

    def run(cfg: Config, *dst: torch.Tensor) -> None:
        grid = (triton.cdiv(n_rows, cfg["ROWS_PER_PROGRAM"]),)
        _qk_norm_rope_kernel[grid](
            x,
            weights[0] if weights[0] is not None else x,  # dummy pointer, never read when HAS_WEIGHT=False
            cos,
            sin,
            dst[0],
            x2,
            w2 if w2 is not None else x,  # dummy pointer, never read when HAS_WEIGHT2=False
            dst[1] if pair else dst[0],  # never written when PAIR=False
            n_rows,
            S,
            H,
            x.stride(0),
            x.stride(1),
            x.stride(2),
            x2.stride(0),
            x2.stride(1),
            x2.stride(2),
            cos.stride(0),
            cos.stride(1),
            sin.stride(0),
            sin.stride(1),
            half,
            float(epss[0]),
            float(eps2),
            IS_COMPLEX=mode == "complex",
            HAS_WEIGHT=weights[0] is not None,
            HAS_WEIGHT2=w2 is not None,
            PAIR=pair,
            ONE_TOKEN=H % cfg["ROWS_PER_PROGRAM"] == 0,
            **cfg, **launch_options(x.device)
        )

    rows = pow2_bucket(n_rows)
    key = shape_key(d=D, rows=rows, dtype=x.dtype, mode=mode, weight=weights[0] is not None,
                    **({"pair": True} if pair else {}))
    _autotune.launch_tuned("qk_norm_rope", key, candidates(half, rows), run, outs, x.device, config)
    return outs


def launch(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    mode: str,
    out: torch.Tensor | None = None,
    *,
    config: Config | None = None,
) -> torch.Tensor:
    """Run the Triton kernel. x (B, S, H, D) with unit stride on D (other strides free);
    cos/sin float32 (S, D/2) for mode="complex" or (S, D) for mode="real", any strides.
    Returns a contiguous (B, S, H, D) tensor of x.dtype (written into ``out`` when given).
    ``config`` forces a launch config (one of ``candidates``); by default the autotuner picks it."""
    return _launch((x,), (weight,), (eps,), cos, sin, mode, (out,), config)[0]


def launch_pair(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    x2: torch.Tensor,
    weight2: torch.Tensor | None,
    eps2: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mode: str,
    out: torch.Tensor | None = None,
    out2: torch.Tensor | None = None,
    *,
    config: Config | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`launch` for two tensors of one shape (Q and K) rotated by the same tables, in one
    kernel that reads each table row once for both. Each keeps its own weight and eps."""
    out, out2 = _launch((x, x2), (weight, weight2), (eps, eps2), cos, sin, mode, (out, out2), config)
    return out, out2


# ----------------------------------------------------------------------------- custom op
@torch.library.custom_op("kopt::qk_norm_rope", mutates_args=())
def qk_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    mode: str,
) -> torch.Tensor:
    """RMSNorm(x) over D then RoPE; the Triton launcher on CUDA, the reference elsewhere."""
    if x.is_cuda:
        return launch(x, weight, cos, sin, eps, mode)
    return reference(x, weight, cos, sin, eps, mode)


@qk_norm_rope.register_fake
def _(x, weight, cos, sin, eps, mode):
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)
