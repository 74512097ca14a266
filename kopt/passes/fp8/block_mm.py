"""The block-scaled FP8 GEMM, ``kopt::fp8_block_mm``: ``(qa ⊙ sa) @ (qb ⊙ sb).T (+ bias)``.

``qa`` is the (M, K) FP8 activation with one scale per 1×128 block (``sa``: (M, K/128));
``qb`` the (N, K) FP8 weight with one scale per 1×128 or 128×128 block (``sb``: (N, K/128) or
(N/128, K/128)), both as :func:`kopt.fp8.quantize.quantize` makes them.

On CUDA this is one cuBLAS block-scaled GEMM (``torch.nn.functional.scaled_mm`` with the
``BlockWise`` recipes, Hopper and later). cuBLAS wants each scale grid in a particular memory
order; :func:`cuda_scale_layout` finds it once per device by checking candidate orders against the
definition on a small product (so a torch release that changes the requirement is detected, not
silently wrong), and :func:`pack_weight_scale` puts constant weight scales in that order at compile
time so that no call re-packs them. cuBLAS does not take every shape (FLUX.2's first block-scaled
run met CUBLAS_STATUS_NOT_SUPPORTED): :func:`cuda_shape_check` runs each (M, K, N) once at compile time
against the definition, and the ``fp8-linear`` pass leaves a linear it refuses in bf16, saying why.
Elsewhere (the CPU, or a GPU without block-scaled GEMMs, with a warning) the op computes the
definition: dequantize in float32, matmul, add the bias.

Valid because both paths compute ``sum_k qa[m,k]·sa[m,k//128]·qb[n,k]·sb[n//br,k//128]``, the
linear on the dequantized values, accumulated in float32.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import warnings

import torch

from kopt.fp8.quantize import BLOCK, dequantize


@dataclasses.dataclass(frozen=True)
class ScaleLayout:
    """How cuBLAS wants the scales: each grid row- or column-major, and B's grid transposed or not."""

    a_column_major: bool
    b_column_major: bool
    b_transposed: bool

    def describe(self) -> str:
        order = {False: "row-major", True: "column-major"}
        return (f"activation scales {order[self.a_column_major]}, weight scales {order[self.b_column_major]}"
                + (" and transposed" if self.b_transposed else ""))


def _ordered(scale: torch.Tensor, column_major: bool) -> torch.Tensor:
    """``scale`` with the same values in the requested memory order (no copy if already so)."""
    if column_major:
        if scale.stride() == (1, scale.shape[0]):
            return scale
        # empty_strided, not .t().contiguous().t(): for one row, torch would keep the row-major strides
        return torch.empty_strided(scale.shape, (1, scale.shape[0]), dtype=scale.dtype,
                                   device=scale.device).copy_(scale)
    return scale.contiguous()


def _recipe(rows_per_scale: int):  # noqa: ANN202 - torch.nn.functional._ScalingType
    from torch.nn.functional import ScalingType

    return ScalingType.BlockWise1x128 if rows_per_scale == 1 else ScalingType.BlockWise128x128


def _cuda_mm(qa: torch.Tensor, sa: torch.Tensor, qb: torch.Tensor, sb: torch.Tensor, bias: torch.Tensor | None,
             out_dtype: torch.dtype, layout: ScaleLayout) -> torch.Tensor:
    weight_rows_per_scale = -(-qb.shape[0] // sb.shape[0])
    b_scale = _ordered(sb, layout.b_column_major)
    out = torch.nn.functional.scaled_mm(
        qa, qb.t(), _ordered(sa, layout.a_column_major), _recipe(1),
        b_scale.t() if layout.b_transposed else b_scale, _recipe(weight_rows_per_scale),
        output_dtype=out_dtype)
    return out if bias is None else out + bias  # cuBLAS' block-scaled GEMM takes no bias epilogue


def reference(qa: torch.Tensor, sa: torch.Tensor, qb: torch.Tensor, sb: torch.Tensor, bias: torch.Tensor | None,
              out_dtype: torch.dtype) -> torch.Tensor:
    """The definition: dequantize both operands in float32, multiply, add the bias, cast."""
    out = dequantize(qa, sa) @ dequantize(qb, sb).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


@functools.cache
def cuda_scale_layout(device_index: int, weight_rows_per_scale: int) -> ScaleLayout | str:
    """The scale memory order this GPU's block-scaled GEMM accepts, or why there is none."""
    from kopt.fp8.quantize import FP8, Granularity, Operand, quantize

    if not hasattr(torch.nn.functional, "scaled_mm"):
        return f"torch {torch.__version__} has no torch.nn.functional.scaled_mm"
    device = torch.device("cuda", device_index)
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(256, 4 * BLOCK, device=device, generator=generator) * torch.rand(256, 1, device=device)
    b = torch.randn(256, 4 * BLOCK, device=device, generator=generator) * torch.rand(256, 1, device=device)
    weight_granularity = Granularity.BLOCK_1X128 if weight_rows_per_scale == 1 else Granularity.BLOCK_128X128
    qa, sa = quantize(a, Granularity.BLOCK_1X128, Operand.ACTIVATION)
    qb, sb = quantize(b, weight_granularity, Operand.WEIGHT)
    assert qa.dtype == FP8
    expected = reference(qa, sa, qb, sb, None, torch.float32)
    errors = []
    for flags in itertools.product((True, False), repeat=3):
        layout = ScaleLayout(*flags)
        try:
            got = _cuda_mm(qa, sa, qb, sb, None, torch.bfloat16, layout).float()
        except Exception as error:  # noqa: BLE001 - a refused layout is what we are probing for
            errors.append(f"{layout.describe()}: {type(error).__name__}: {str(error).splitlines()[0][:120]}")
            continue
        rel = ((got - expected).norm() / expected.norm()).item()
        if rel < 1e-2:
            return layout
        errors.append(f"{layout.describe()}: runs but relative error {rel:.3g} (wrong scale order)")
    return "no scale layout works: " + "; ".join(errors)


CHECK_ELEMENTS = 1 << 26  # the shape check's random weight stays under 256 MiB in float32


@functools.cache
def cuda_shape_check(device_index: int, m: int, k: int, n: int, weight_rows_per_scale: int) -> str | None:
    """None if this GPU's block-scaled GEMM computes an (M, K) × (N, K)ᵀ product correctly, else why not
    (refused by cuBLAS, or a wrong result). Random operands with uneven row magnitudes, compared
    with the dequantized float32 product; run once per shape, at compile time. The product's own
    M and K are used (what cuBLAS' scale layouts depend on), and N up to ``CHECK_ELEMENTS / K``
    rows in whole 128-row tiles: a merged weight (Qwen-Image's modulation: 2.2 M × 3072) would
    otherwise need a 27 GB float32 copy just to be checked."""
    from kopt.fp8.quantize import Granularity, Operand, quantize

    layout = cuda_scale_layout(device_index, weight_rows_per_scale)
    if not isinstance(layout, ScaleLayout):
        return layout
    n = min(n, max(BLOCK, CHECK_ELEMENTS // k // BLOCK * BLOCK))
    device = torch.device("cuda", device_index)
    generator = torch.Generator(device=device).manual_seed(m * 31 + k * 7 + n)
    a = torch.randn(m, k, device=device, generator=generator) * torch.rand(m, 1, device=device, generator=generator)
    b = torch.randn(n, k, device=device, generator=generator) * torch.rand(n, 1, device=device, generator=generator)
    weight_granularity = Granularity.BLOCK_1X128 if weight_rows_per_scale == 1 else Granularity.BLOCK_128X128
    qa, sa = quantize(a, Granularity.BLOCK_1X128, Operand.ACTIVATION)
    qb, sb = quantize(b, weight_granularity, Operand.WEIGHT)
    del a, b
    try:
        got = _cuda_mm(qa, sa, qb, sb, None, torch.bfloat16, layout).float()
    except Exception as error:  # noqa: BLE001 - torch's argument checks (ValueError) or cuBLAS (RuntimeError)
        return f"cuBLAS refuses {m}×{k}×{n}: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}"
    expected = reference(qa, sa, qb, sb, None, torch.float32)
    rel = ((got - expected).norm() / expected.norm().clamp(min=1e-30)).item()
    if not rel < 1e-2:
        return f"cuBLAS computes {m}×{k}×{n} wrongly here (relative error {rel:.3g})"
    return None


def pack_weight_scale(scale: torch.Tensor, weight_rows_per_scale: int) -> torch.Tensor:
    """A constant weight scale grid in the memory order the GEMM on its device takes (compile time)."""
    if scale.is_cuda:
        layout = cuda_scale_layout(scale.device.index or 0, weight_rows_per_scale)
        if isinstance(layout, ScaleLayout):
            return _ordered(scale, layout.b_column_major)
    return scale.contiguous()


_WARNED: set[str] = set()


@torch.library.custom_op("kopt::fp8_block_mm", mutates_args=())
def fp8_block_mm(qa: torch.Tensor, sa: torch.Tensor, qb: torch.Tensor, sb: torch.Tensor, bias: torch.Tensor | None,
                 out_dtype: torch.dtype, weight_rows_per_scale: int) -> torch.Tensor:
    """Block-scaled FP8 ``qa @ qb.T`` (+ bias) in ``out_dtype``; cuBLAS on CUDA, the definition elsewhere."""
    if qa.is_cuda:
        layout = cuda_scale_layout(qa.device.index or 0, weight_rows_per_scale)
        if isinstance(layout, ScaleLayout):
            return _cuda_mm(qa, sa, qb, sb, bias, out_dtype, layout)
        if layout not in _WARNED:
            _WARNED.add(layout)
            warnings.warn(f"kopt::fp8_block_mm falls back to dequantize + matmul (slow): {layout}", stacklevel=2)
    return reference(qa, sa, qb, sb, bias, out_dtype)


@fp8_block_mm.register_fake
def _(qa, sa, qb, sb, bias, out_dtype, weight_rows_per_scale):
    return qa.new_empty((qa.shape[0], qb.shape[0]), dtype=out_dtype)
