"""kopt::adaln_modulation: the Triton launcher (interpreted on CPU) against the eager spec, and the op."""

from __future__ import annotations

import zlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from kopt.kernels import adaln_modulation as mod
from tests.conftest import rel_err

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _inputs(b, s, n, dtype, seed, mod_dtype=None, mod_3d=False, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    mod_dtype = mod_dtype or dtype
    x = (torch.randn(b, s, n, generator=g) * 3 + 0.5).to(dtype)
    shape = (b, 1, n) if mod_3d else (b, n)
    scale = (torch.randn(shape, generator=g) * 0.5).to(mod_dtype)
    shift = torch.randn(shape, generator=g).to(mod_dtype)
    weight = (torch.randn(n, generator=g) * 0.2 + 1).to(dtype)
    return [t.to(device) for t in (x, scale, shift, weight)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("b,s,n", [(2, 5, 96), (1, 3, 257), (2, 1, 130), (1, 1, 33)])
def test_launch_matches_reference(b, s, n, dtype, rms):
    seed = zlib.crc32(repr((b, s, n, dtype, rms)).encode())  # deterministic per case
    x, scale, shift, weight = _inputs(b, s, n, dtype, seed)
    w = weight if rms else None
    out = mod.launch(x, scale, shift, w, eps=1e-6, rms=rms)
    ref = mod.reference(x, scale, shift, w, eps=1e-6, rms=rms)
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_err(out, ref) < TOL[dtype]


def test_rms_without_weight_and_mixed_dtypes():
    # bf16 activations with fp32 modulation (a common serving setup), (B, 1, N) modulation shape.
    x, scale, shift, _ = _inputs(2, 3, 200, torch.bfloat16, 11, mod_dtype=torch.float32, mod_3d=True)
    out = mod.launch(x, scale, shift, None, eps=1e-5, rms=True)
    ref = mod.reference(x, scale, shift, None, eps=1e-5, rms=True)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, ref) < TOL[torch.bfloat16]


def test_chunked_modulation_views_without_copy():
    # diffusers chunks a (B, 3N) projection: scale/shift are strided views.
    g = torch.Generator().manual_seed(5)
    n = 96
    x = torch.randn(2, 4, n, generator=g)
    shift, scale, _gate = torch.randn(2, 3 * n, generator=g).chunk(3, dim=-1)
    assert not scale.is_contiguous()
    out = mod.launch(x, scale, shift)
    assert rel_err(out, mod.reference(x, scale, shift)) < TOL[torch.float32]


def test_noncontiguous_x():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 96, 5, generator=g).transpose(1, 2)
    scale, shift = torch.randn(2, 96, generator=g), torch.randn(2, 96, generator=g)
    out = mod.launch(x, scale, shift)
    assert out.is_contiguous()
    assert rel_err(out, mod.reference(x, scale, shift)) < TOL[torch.float32]


@pytest.mark.parametrize("rms", [False, True])
def test_modulation_is_applied(rms):
    """Fails for a kernel returning zeros or the unmodulated norm."""
    x, scale, shift, _ = _inputs(2, 3, 100, torch.float32, 21)
    out = mod.launch(x, scale, shift, rms=rms)
    ref = mod.reference(x, scale, shift, rms=rms)
    plain = mod.reference(x, torch.zeros_like(scale), torch.zeros_like(shift), rms=rms)
    assert rel_err(out, ref) < TOL[torch.float32]
    assert rel_err(out, plain) > 0.1
    assert rel_err(torch.zeros_like(out), ref) == 1.0
    # Per-batch modulation: swapping the batch rows of scale/shift must change the result.
    swapped = mod.launch(x, scale.flip(0), shift.flip(0), rms=rms)
    assert rel_err(swapped, ref) > 0.1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rms", [False, True])
def test_poisoned_output_fully_written(dtype, rms):
    x, scale, shift, weight = _inputs(2, 3, 257, dtype, 31)
    out = torch.full_like(x, float("nan"))
    res = mod.launch(x, scale, shift, weight if rms else None, rms=rms, out=out)
    assert res is out
    assert not torch.isnan(out).any()
    assert rel_err(out, mod.reference(x, scale, shift, weight if rms else None, rms=rms)) < TOL[dtype]


def test_launcher_rejects_bad_inputs():
    x, scale, shift, weight = _inputs(2, 3, 64, torch.float32, 41)
    with pytest.raises(ValueError, match="x must be"):
        mod.launch(x[0], scale, shift)
    with pytest.raises(ValueError, match="scale must have shape"):
        mod.launch(x, scale[:, :32], shift)
    with pytest.raises(ValueError, match="dtype"):
        mod.launch(x.to(torch.int32), scale, shift)
    with pytest.raises(ValueError, match="only supported with rms"):
        mod.launch(x, scale, shift, weight, rms=False)
    with pytest.raises(ValueError, match="out must be"):
        mod.launch(x, scale, shift, out=torch.empty(2, 3, 64, dtype=torch.bfloat16))


@pytest.mark.parametrize("rms", [False, True])
def test_op_on_cpu_equals_reference(rms):
    x, scale, shift, weight = _inputs(2, 5, 96, torch.bfloat16, 51)
    w = weight if rms else None
    out = torch.ops.kopt.adaln_modulation(x, scale, shift, w, 1e-6, rms)
    assert torch.equal(out, mod.reference(x, scale, shift, w, 1e-6, rms))


def test_op_fake_tensor_mode(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("the fake implementation must not compute")

    monkeypatch.setattr(mod, "reference", boom)
    monkeypatch.setattr(mod, "launch", boom)
    with FakeTensorMode():
        x = torch.empty(2, 7, 96, dtype=torch.bfloat16)
        scale = torch.empty(2, 96, dtype=torch.bfloat16)
        shift = torch.empty(2, 1, 96, dtype=torch.bfloat16)
        out = torch.ops.kopt.adaln_modulation(x, scale, shift, None, 1e-6, False)
    assert isinstance(out, FakeTensor)
    assert out.shape == (2, 7, 96) and out.dtype == torch.bfloat16


def test_op_compiles_fullgraph():
    x, scale, shift, weight = _inputs(2, 5, 96, torch.float32, 61)

    def fn(x, scale, shift, weight):
        a = torch.ops.kopt.adaln_modulation(x, scale, shift, None, 1e-6, False)
        b = torch.ops.kopt.adaln_modulation(x, scale, shift, weight, 1e-6, True)
        return a + b

    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    expected = mod.reference(x, scale, shift) + mod.reference(x, scale, shift, weight, rms=True)
    torch.testing.assert_close(compiled(x, scale, shift, weight), expected)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("rms", [False, True])
def test_gpu_production_shape(rms):
    x, scale, shift, weight = _inputs(1, 4096, 3072, torch.bfloat16, 71, device="cuda")
    w = weight if rms else None
    ref = mod.reference(x, scale, shift, w, rms=rms)
    out = torch.full_like(x, float("nan"))
    mod.launch(x, scale, shift, w, rms=rms, out=out)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < TOL[torch.bfloat16]
    op_out = torch.ops.kopt.adaln_modulation(x, scale, shift, w, 1e-6, rms)
    assert rel_err(op_out, ref) < TOL[torch.bfloat16]


@pytest.mark.gpu
@needs_cuda
def test_gpu_op_under_compile():
    x, scale, shift, _ = _inputs(1, 4096, 3072, torch.bfloat16, 81, device="cuda")
    fn = torch.compile(lambda x, a, b: torch.ops.kopt.adaln_modulation(x, a, b, None, 1e-6, False), fullgraph=True)
    assert rel_err(fn(x, scale, shift), mod.reference(x, scale, shift)) < TOL[torch.bfloat16]
