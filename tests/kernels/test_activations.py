"""kopt::gelu_tanh and kopt::swiglu: the Triton launchers (interpreted on CPU) against the eager
specs, the specs against diffusers / torch, and the ops under FakeTensor / torch.compile."""

from __future__ import annotations

import warnings
import zlib

import pytest
import torch
from diffusers.models.transformers.transformer_flux2 import Flux2SwiGLU
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from kopt.kernels import gelu_tanh, swiglu
from tests.conftest import rel_err

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _randn(*shape, dtype=torch.float32, key=(), scale=2.0, device="cpu"):
    g = torch.Generator().manual_seed(zlib.crc32(repr((shape, dtype, key)).encode()))
    return (torch.randn(*shape, generator=g) * scale + 0.1).to(dtype).to(device)


# ----------------------------------------------------------------------------- gelu_tanh
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1823,), (3, 7, 97), (1, 1), (2, 40, 1025)])
def test_gelu_launch_matches_reference(shape, dtype):
    x = _randn(*shape, dtype=dtype)
    out = gelu_tanh.launch(x)
    assert out.shape == x.shape and out.dtype == dtype
    assert rel_err(out, gelu_tanh.reference(x)) < TOL[dtype]


def test_gelu_extreme_values_are_finite_and_exact():
    x = torch.tensor([-80.0, -20.0, -5.0, -1e-6, 0.0, 1e-6, 5.0, 20.0, 80.0])
    with warnings.catch_warnings():  # the interpreter's numpy exp may warn about overflow to inf
        warnings.simplefilter("ignore", RuntimeWarning)
        out = gelu_tanh.launch(x)
    torch.testing.assert_close(out, torch.nn.functional.gelu(x, approximate="tanh"), rtol=1e-6, atol=1e-7)


def test_gelu_reference_matches_torch_and_diffusers():
    from diffusers.models.activations import GELU

    x = _randn(5, 64, key="diffusers")
    assert rel_err(gelu_tanh.reference(x), torch.nn.functional.gelu(x, approximate="tanh")) == 0.0
    layer = GELU(64, 64, approximate="tanh")  # diffusers' GELU module: proj, then F.gelu(tanh)
    with torch.no_grad():
        expected = layer(x)
        got = gelu_tanh.reference(layer.proj(x))
    assert rel_err(got, expected) < 1e-6
    assert rel_err(gelu_tanh.launch(layer.proj(x).detach()), expected) < TOL[torch.float32]
    # the exact (erf) GELU is measurably different: a kernel computing it instead fails
    assert rel_err(torch.nn.functional.gelu(x), gelu_tanh.launch(x)) > 10 * TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_poisoned_out_and_not_identity(dtype):
    x = _randn(1823, dtype=dtype, key="nan")
    out = torch.full_like(x, float("nan"))
    assert gelu_tanh.launch(x, out=out) is out
    assert not torch.isnan(out).any()
    ref = gelu_tanh.reference(x)
    assert rel_err(out, ref) < TOL[dtype]
    assert rel_err(x, ref) > 0.1  # a kernel that copies x through fails


def test_gelu_validates_inputs():
    x = _randn(8, 6)
    with pytest.raises(ValueError, match="contiguous"):
        gelu_tanh.launch(x.t())
    with pytest.raises(ValueError, match="dtype"):
        gelu_tanh.launch(x.double())
    with pytest.raises(ValueError, match="out"):
        gelu_tanh.launch(x, out=torch.empty(8, 5))


# ----------------------------------------------------------------------------- swiglu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 7, 2 * 97), (1, 2 * 1500), (2, 1, 5, 2 * 33), (1, 2)])
def test_swiglu_launch_matches_reference(shape, dtype):
    h = _randn(*shape, dtype=dtype)
    out = swiglu.launch(h)
    assert out.shape == (*shape[:-1], shape[-1] // 2) and out.dtype == dtype
    assert rel_err(out, swiglu.reference(h)) < TOL[dtype]


def test_swiglu_strided_rows():
    """h as a row-strided view (e.g. a slice of a wider projection output)."""
    wide = _randn(4, 6, 300, key="wide")
    h = wide[..., : 2 * 97]
    assert not h.is_contiguous()
    assert rel_err(swiglu.launch(h), swiglu.reference(h)) < TOL[torch.float32]


def test_swiglu_reference_matches_diffusers_flux2():
    h = _randn(2, 5, 2 * 97, key="flux2")
    expected = Flux2SwiGLU()(h)
    assert rel_err(swiglu.reference(h), expected) < 1e-7
    assert rel_err(swiglu.launch(h), expected) < TOL[torch.float32]


def test_swiglu_gates_the_first_half():
    """Fails for a kernel that gates the wrong half, skips the gate, or returns zeros."""
    h = _randn(3, 2 * 97, key="halves")
    f = 97
    ref = swiglu.reference(h)
    out = swiglu.launch(h)
    assert rel_err(out, ref) < TOL[torch.float32]
    assert rel_err(torch.nn.functional.silu(h[..., f:]) * h[..., :f], ref) > 0.1
    assert rel_err(h[..., :f] * h[..., f:], ref) > 0.1
    assert rel_err(torch.zeros_like(ref), ref) == 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_poisoned_out(dtype):
    h = _randn(3, 7, 2 * 97, dtype=dtype, key="nan")
    out = torch.full((3, 7, 97), float("nan"), dtype=dtype)
    assert swiglu.launch(h, out=out) is out
    assert not torch.isnan(out).any()
    assert rel_err(out, swiglu.reference(h)) < TOL[dtype]


def test_swiglu_validates_inputs():
    with pytest.raises(ValueError, match="even"):
        swiglu.launch(_randn(3, 7))
    with pytest.raises(ValueError, match="unit stride"):
        swiglu.launch(_randn(6, 4).t())
    with pytest.raises(ValueError, match="out"):
        swiglu.launch(_randn(3, 8), out=torch.empty(3, 8))


# ----------------------------------------------------------------------------- ops
def test_ops_on_cpu_equal_reference():
    x = _randn(3, 97, dtype=torch.bfloat16, key="op")
    torch.testing.assert_close(torch.ops.kopt.gelu_tanh(x), gelu_tanh.reference(x), rtol=0, atol=0)
    h = _randn(3, 2 * 97, dtype=torch.bfloat16, key="op")
    torch.testing.assert_close(torch.ops.kopt.swiglu(h), swiglu.reference(h), rtol=0, atol=0)


def test_ops_fake_shapes():
    with FakeTensorMode():
        x = torch.empty(2, 11, 97, dtype=torch.bfloat16)
        y = torch.ops.kopt.gelu_tanh(x)
        assert isinstance(y, FakeTensor) and y.shape == x.shape and y.dtype == torch.bfloat16
        h = torch.empty(2, 11, 2 * 97, dtype=torch.bfloat16)
        z = torch.ops.kopt.swiglu(h)
        assert isinstance(z, FakeTensor) and z.shape == (2, 11, 97) and z.dtype == torch.bfloat16


def test_ops_under_torch_compile_fullgraph():
    def fn(h):
        return torch.ops.kopt.gelu_tanh(torch.ops.kopt.swiglu(h)) + 1

    h = _randn(2, 5, 2 * 33, key="compile")
    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(h), gelu_tanh.reference(swiglu.reference(h)) + 1)


@pytest.mark.gpu
@needs_cuda
def test_gpu_production_shapes():
    h = _randn(1, 4096, 2 * 18432, dtype=torch.bfloat16, key="gpu", device="cuda")
    ref = swiglu.reference(h)
    out = torch.full_like(ref, float("nan"))
    swiglu.launch(h, out=out)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < TOL[torch.bfloat16]
    assert rel_err(torch.ops.kopt.swiglu(h), ref) < TOL[torch.bfloat16]

    x = _randn(1, 4096, 12288, dtype=torch.bfloat16, key="gpu", device="cuda")
    ref = gelu_tanh.reference(x)
    out = torch.full_like(x, float("nan"))
    gelu_tanh.launch(x, out=out)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < TOL[torch.bfloat16]
    assert rel_err(torch.ops.kopt.gelu_tanh(x), ref) < TOL[torch.bfloat16]


@pytest.mark.gpu
@needs_cuda
def test_gpu_ops_under_compile():
    h = _randn(1, 4096, 2 * 3072, dtype=torch.bfloat16, key="gpu-compile", device="cuda")
    fn = torch.compile(lambda h: torch.ops.kopt.gelu_tanh(torch.ops.kopt.swiglu(h)), fullgraph=True)
    assert rel_err(fn(h), gelu_tanh.reference(swiglu.reference(h))) < TOL[torch.bfloat16]
