"""kopt.kernels._fastmath: the inline-PTX exp2, reciprocal and bfloat16 rounding (GPU) and their
plain-Triton forms (the CPU interpreter) against torch, on fresh random values."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kopt.kernels._fastmath import exp2, fast_math, reciprocal, round_to, tanh

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@triton.jit
def _apply(x_ptr, e_ptr, r_ptr, b_ptr, n, BLOCK: tl.constexpr, FAST: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=1.0)
    tl.store(e_ptr + offs, exp2(x, FAST), mask=offs < n)
    tl.store(r_ptr + offs, reciprocal(x, FAST), mask=offs < n)
    tl.store(b_ptr + offs, round_to(x, tl.bfloat16, FAST), mask=offs < n)


def _run(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    e, r, b = (torch.full_like(x, float("nan")) for _ in range(3))
    _apply[(triton.cdiv(x.numel(), 256),)](x, e, r, b, x.numel(), BLOCK=256, FAST=fast_math(x.device))
    return e, r, b


def _values(device: str, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 20
    # bfloat16 ties (exactly halfway between two bfloat16 values) must round to even
    ties = torch.randn(64, generator=g).bfloat16().float().view(torch.int32) | 0x8000
    return torch.cat([x, ties.view(torch.float32)]).to(device)


def _check(x: torch.Tensor) -> None:
    e, r, b = _run(x)
    xd = x.double()
    finite = torch.isfinite(torch.exp2(xd).float()) & (torch.exp2(xd) > 2.0**-126)
    assert ((e.double() - torch.exp2(xd)).abs() / torch.exp2(xd))[finite].max().item() < 2.0**-21
    assert ((r.double() - 1 / xd).abs() * xd.abs()).max().item() < 2.0**-22
    assert torch.equal(b, x.bfloat16().float())


def test_interpreted_forms_match_torch():
    assert not fast_math(torch.device("cpu"))
    _check(_values("cpu", 2000))


@pytest.mark.gpu
@needs_cuda
def test_gpu_ptx_forms_match_torch():
    assert fast_math(torch.device("cuda"))
    _check(_values("cuda", 1 << 20))


@triton.jit
def _apply_tanh(x_ptr, t_ptr, n, BLOCK: tl.constexpr, FAST: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(t_ptr + offs, tanh(x, FAST), mask=offs < n)


def _tanh_errors(x: torch.Tensor) -> tuple[float, float]:
    """(largest absolute, largest relative error) of the kernel's tanh against float64."""
    t = torch.full_like(x, float("nan"))
    _apply_tanh[(triton.cdiv(x.numel(), 256),)](x, t, x.numel(), BLOCK=256, FAST=fast_math(x.device))
    exact = torch.tanh(x.double())
    error = (t.double() - exact).abs()
    return error.max().item(), (error / exact.abs().clamp_min(2.0**-60)).max().item()


def test_interpreted_tanh_has_float32_absolute_error():
    x = torch.cat([_values("cpu", 2000) / 10, torch.tensor([0.0, 1e-8, -1e-8, 60.0, -60.0, 1e4, -1e4])])
    absolute, _ = _tanh_errors(x)
    assert absolute < 4e-7


@pytest.mark.gpu
@needs_cuda
def test_gpu_tanh_is_within_the_ptx_bound():
    absolute, relative = _tanh_errors(_values("cuda", 1 << 20) / 10)
    assert relative < 2.0**-10.5 and absolute < 2.0**-10.5
