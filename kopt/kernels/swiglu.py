"""FLUX.2 SwiGLU activation: ``y = silu(h[..., :F]) * h[..., F:]`` for h of shape (..., 2F).

Matches diffusers ``Flux2SwiGLU.forward``: the *first* half is gated (goes through SiLU), the second
half is the linear value. Float32 compute, ``silu(a) = a / (1 + exp(-a))``, cast back to h.dtype.

Bytes moved (memory floor), M = h.numel() / (2F) rows, element size e (2 for bf16)::

    bytes = 2F * M * e (read h) + F * M * e (write y) = 3 * F * M * e

FLUX.2 feed-forward, bf16 h (1, 4096, 2*18432): 3 * 18432 * 4096 * 2 B = 453 MB.
"""

import functools

import torch
import triton
import triton.language as tl

from kopt.kernels import _autotune
from kopt.kernels._autotune import Config, pow2_bucket, shape_key
from kopt.kernels._pdl import begin, launch_options

__all__ = ["candidates", "launch", "reference", "swiglu"]


# ----------------------------------------------------------------------------- reference (spec)
def reference(h: torch.Tensor) -> torch.Tensor:
    """Eager spec: float32 silu(h[..., :F]) * h[..., F:], cast back to h.dtype."""
    f = h.shape[-1] // 2
    hf = h.float()
    return (torch.nn.functional.silu(hf[..., :f]) * hf[..., f:]).to(h.dtype)


# ----------------------------------------------------------------------------- Triton kernel
@triton.jit
def _swiglu_kernel(h_ptr, out_ptr, F, stride_hm, BLOCK: tl.constexpr, PDL: tl.constexpr):
    begin(PDL)
    # grid: (rows, column blocks); rows on axis 0 (no 65535 limit there)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F
    gate_ptr = h_ptr + row * stride_hm + cols
    a = tl.load(gate_ptr, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(gate_ptr + F, mask=mask, other=0.0).to(tl.float32)
    y = a / (1.0 + tl.exp(-a)) * b
    tl.store(out_ptr + row * F + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- launcher
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


_WARPS = (2, 4, 8, 16)
_BLOCKS = (128, 256, 512, 1024, 2048, 4096, 8192)


def default_config(f: int, dtype: torch.dtype) -> Config:
    """The heuristic (BLOCK, num_warps) for half-width ``f``: the row half up to 2048 (1024 for fp32)."""
    f_class = min((f - 1).bit_length(), 16)
    block = min(triton.next_power_of_2(1 << f_class), 2048 if dtype != torch.float32 else 1024)
    block = max(block, 128)
    num_warps = 8 if block >= 2048 else 4 if block >= 512 else 2
    return {"BLOCK": block, "num_warps": num_warps}


@functools.cache
def _candidates(f: int, dtype: torch.dtype) -> tuple[Config, ...]:
    return _autotune.block_candidates(default_config(f, dtype), max(triton.next_power_of_2(f), 128), _BLOCKS,
                                      _WARPS, 2)


def candidates(f: int, dtype: torch.dtype) -> list[Config]:
    """Candidate configs for half-width ``f``: the heuristic default first, then every (BLOCK, num_warps)
    with 2..32 elements per thread and BLOCK no wider than F rounded up (at least 128)."""
    return [dict(c) for c in _candidates(f, dtype)]


def launch(h: torch.Tensor, out: torch.Tensor | None = None, *, config: Config | None = None) -> torch.Tensor:
    """Run the Triton kernel. h (..., 2F) with unit stride on the last dim and leading dims that
    flatten to one row stride; returns a contiguous (..., F) tensor (into ``out`` if given).
    ``config`` forces a launch config (one of ``candidates``); by default the autotuner picks it."""
    if h.dtype not in _DTYPES:
        raise ValueError(f"h dtype must be one of {_DTYPES}, got {h.dtype}")
    if h.dim() == 0 or h.shape[-1] % 2:
        raise ValueError(f"last dim of h must be even (2F), got shape {tuple(h.shape)}")
    if h.stride(-1) != 1:
        raise ValueError(f"h must have unit stride on the last dim, got strides {h.stride()}")
    f = h.shape[-1] // 2
    out_shape = (*h.shape[:-1], f)
    if out is None:
        out = torch.empty(out_shape, dtype=h.dtype, device=h.device)
    elif tuple(out.shape) != out_shape or out.dtype != h.dtype or not out.is_contiguous() or out.device != h.device:
        raise ValueError(f"out must be a contiguous {h.dtype} tensor of shape {out_shape} on {h.device}")
    if out.numel() == 0:
        return out
    h2 = h.reshape(-1, 2 * f)  # a view for contiguous leading dims (copies otherwise)
    m = h2.shape[0]

    def run(cfg: Config, dst: torch.Tensor) -> None:
        _swiglu_kernel[(m, triton.cdiv(f, cfg["BLOCK"]))](h2, dst, f, h2.stride(0), **cfg,
                                                          **launch_options(h.device))

    rows = pow2_bucket(m)
    key = shape_key(f=f, rows=rows, dtype=h.dtype)
    _autotune.launch_tuned("swiglu", key, candidates(f, h.dtype), run, (out,), h.device, config)
    return out


# ----------------------------------------------------------------------------- custom op
@torch.library.custom_op("kopt::swiglu", mutates_args=())
def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(h[..., :F]) * h[..., F:]; the Triton launcher on CUDA, the reference elsewhere."""
    if h.is_cuda:
        return launch(h)
    return reference(h)


@swiglu.register_fake
def _(h):
    if h.dim() == 0 or h.shape[-1] % 2:
        raise ValueError(f"last dim of h must be even (2F), got shape {tuple(h.shape)}")
    return torch.empty((*h.shape[:-1], h.shape[-1] // 2), dtype=h.dtype, device=h.device)
