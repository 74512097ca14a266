"""Exponential, reciprocal, tanh and bfloat16 rounding in as few instructions as the GPU has, for the
element-wise kernels that instruction issue bounds rather than memory. Qwen-Image's GELU-tanh
quantize, compiled for sm_90: 36.7 SASS instructions per value with plain Triton math, 28.7 with
these forms (one 16384-wide block per row), 20.3 with them in three 4096-wide register chunks
(``python benchmarks/tools/sass.py``).

Why: Triton lowers ``tl.exp`` to ``ex2.approx.f32`` and ``/`` to ``div.full.f32``. For inputs or
results in float32's subnormal range both need a guard, which ptxas emits as a compare and two
predicated multiplies around each special-function instruction (``div.full`` also rescales huge
divisors): up to five instructions where one does. The ``.ftz`` forms flush subnormals to zero.
That is valid wherever a subnormal cannot matter: an ``exp2`` whose result is added to 1 or
rounded to FP8 (e4m3's smallest step is 2⁻⁹ of the scale) and a reciprocal of a value ≥ 1. Their
accuracy is that of the approximate forms Triton already uses (ex2: 2⁻²² relative; rcp: 1 ulp).

``FAST`` is a constexpr: inline PTX on NVIDIA GPUs, plain Triton math elsewhere (the CPU
interpreter, which runs no PTX) — see :func:`fast_math`.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["exp2", "fast_math", "reciprocal", "round_to", "tanh"]


def fast_math(device: torch.device) -> bool:
    """Whether kernels on ``device`` may use the inline-PTX forms: a CUDA (not ROCm) GPU, not interpreted."""
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return device.type == "cuda" and torch.version.hip is None and not interpreted


@triton.jit
def _ptx_f32(x, ASM: tl.constexpr):
    """One float32 PTX instruction ``ASM`` (``$0`` the result, ``$1`` the operand) per value."""
    return tl.inline_asm_elementwise(ASM, "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def exp2(x, FAST: tl.constexpr):
    """2^x in float32 (results below 2⁻¹²⁶ flush to zero when ``FAST``)."""
    if FAST:
        return _ptx_f32(x, "ex2.approx.ftz.f32 $0, $1;")
    else:
        return tl.exp2(x)


@triton.jit
def reciprocal(x, FAST: tl.constexpr):
    """1 / x in float32 (subnormal inputs and results flush to zero when ``FAST``)."""
    if FAST:
        return _ptx_f32(x, "rcp.approx.ftz.f32 $0, $1;")
    else:
        return 1.0 / x


@triton.jit
def tanh(x, FAST: tl.constexpr):
    """tanh(x) in float32. ``FAST``: one ``tanh.approx.f32`` (relative error at most 2⁻¹¹ by the PTX
    ISA: for a soft-cap of 50, 0.025 on a logit, a fifth of the 0.125 that rounding the logit to bf16
    costs). Otherwise ``1 − 2 / (1 + 2^(2·log2(e)·x))``: ±1 at the ends, absolute error near float32's
    epsilon (relative error grows near 0, where a logit's absolute error is what counts)."""
    if FAST:
        return _ptx_f32(x, "tanh.approx.f32 $0, $1;")
    else:
        return 1.0 - 2.0 / (1.0 + tl.exp2(x * 2.8853900817779268))


@triton.jit
def round_to(x, dtype: tl.constexpr, FAST: tl.constexpr):
    """float32 ``x`` rounded to ``dtype`` (to nearest, ties to even) and back to float32.

    bfloat16 with ``FAST``: two values per ``cvt.rn.bf16x2.f32`` (Triton otherwise converts each
    value on its own, on the conversion unit that the special-function instructions also use).
    bfloat16 without it: integer arithmetic on the bits (add 0x7FFF plus the lowest kept bit, clear
    the low half), because Triton's CPU interpreter truncates when it converts to bfloat16. NaN
    stays NaN and overflow rounds to infinity, as the conversion does."""
    if dtype == tl.bfloat16:
        if FAST:
            packed = tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x], dtype=tl.bfloat16,
                                               is_pure=True, pack=2)
            return packed.to(tl.float32)
        else:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
            return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(dtype).to(tl.float32)
