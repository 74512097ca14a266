"""GELU with the tanh approximation, elementwise: ``y = gelu(x, approximate="tanh")``.

    y = 0.5 * x * (1 + tanh(z)),  z = sqrt(2/pi) * (x + 0.044715 * x**3)

computed in float32 as the algebraically equal, overflow-safe ``y = x * sigmoid(2z) = x / (1 + exp(-2z))``
(for z -> -inf, exp -> inf and y -> -0; for z -> +inf, y -> x), then cast back to x.dtype.

Bytes moved (memory floor), N elements of size e (2 for bf16): ``2 * N * e`` (read x, write y).
E.g. a bf16 (1, 4096, 12288) activation: 2 * 50.3M * 2 B = 201 MB.
"""

import functools
import math

import torch
import triton
import triton.language as tl

from kopt.kernels import _autotune
from kopt.kernels._autotune import Config, pow2_bucket, shape_key
from kopt.kernels._pdl import begin, launch_options

__all__ = ["candidates", "gelu_tanh", "launch", "reference"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# ----------------------------------------------------------------------------- reference (spec)
def reference(x: torch.Tensor) -> torch.Tensor:
    """Eager spec: float32 gelu(approximate="tanh"), cast back to x.dtype."""
    return torch.nn.functional.gelu(x.float(), approximate="tanh").to(x.dtype)


# ----------------------------------------------------------------------------- Triton kernel
@triton.jit
def _gelu_tanh_kernel(x_ptr, out_ptr, n, K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    begin(PDL)
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    z2 = (2.0 * K) * (x + 0.044715 * x * x * x)  # 2z
    y = x / (1.0 + tl.exp(-z2))  # = 0.5 x (1 + tanh z)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- launcher
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


_WARPS = (2, 4, 8, 16)
_BLOCKS = (512, 1024, 2048, 4096, 8192, 16384)


def default_config(size: int, dtype: torch.dtype) -> Config:
    """The heuristic (BLOCK, num_warps) for ``size`` elements (a power-of-two bucket)."""
    if size < (1 << 16):  # < 64K elements: small blocks so that several SMs work
        return {"BLOCK": 1024, "num_warps": 4}
    # 16 B per thread per access: 8 elements of bf16/fp16, 4 of fp32
    return {"BLOCK": 4096, "num_warps": 8} if dtype != torch.float32 else {"BLOCK": 2048, "num_warps": 8}


@functools.cache
def _candidates(size: int, dtype: torch.dtype) -> tuple[Config, ...]:
    return _autotune.block_candidates(default_config(size, dtype), max(size, 1024), _BLOCKS, _WARPS, 4)


def candidates(size: int, dtype: torch.dtype) -> list[Config]:
    """Candidate configs for ``size`` elements (bucketed to a power of two): the heuristic default
    first, then every (BLOCK, num_warps) with 4..32 elements per thread and BLOCK <= max(size, 1024)."""
    return [dict(c) for c in _candidates(pow2_bucket(size), dtype)]


def launch(x: torch.Tensor, out: torch.Tensor | None = None, *, config: Config | None = None) -> torch.Tensor:
    """Run the Triton kernel on a contiguous x; returns y (x's shape and dtype), into ``out`` if given.
    ``config`` forces a launch config (one of ``candidates``); by default the autotuner picks it."""
    if x.dtype not in _DTYPES:
        raise ValueError(f"x dtype must be one of {_DTYPES}, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"x must be contiguous, got strides {x.stride()} for shape {tuple(x.shape)}")
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or out.dtype != x.dtype or not out.is_contiguous() or out.device != x.device:
        raise ValueError(f"out must be a contiguous {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}")
    n = x.numel()
    if n == 0:
        return out

    def run(cfg: Config, dst: torch.Tensor) -> None:
        _gelu_tanh_kernel[(triton.cdiv(n, cfg["BLOCK"]),)](x, dst, n, K=_SQRT_2_OVER_PI, **cfg,
                                                           **launch_options(x.device))

    size = pow2_bucket(n)
    key = shape_key(size=size, dtype=x.dtype)
    _autotune.launch_tuned("gelu_tanh", key, candidates(size, x.dtype), run, (out,), x.device, config)
    return out


# ----------------------------------------------------------------------------- custom op
@torch.library.custom_op("kopt::gelu_tanh", mutates_args=())
def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """gelu(x, approximate="tanh"); the Triton launcher on CUDA, the reference elsewhere."""
    if x.is_cuda:
        return launch(x.contiguous())
    return reference(x)


@gelu_tanh.register_fake
def _(x):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)
