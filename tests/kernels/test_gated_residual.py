"""kopt::gated_residual: the Triton launcher (interpreted on CPU) against the eager spec, and the op."""

from __future__ import annotations

import zlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from kopt.kernels import gated_residual as mod
from tests.conftest import rel_err

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _inputs(b, s, n, dtype, seed, mod_dtype=None, mod_3d=False, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    mod_dtype = mod_dtype or dtype
    r = (torch.randn(b, s, n, generator=g) * 3 + 0.5).to(dtype)
    y = torch.randn(b, s, n, generator=g).to(dtype)
    shape = (b, 1, n) if mod_3d else (b, n)
    gate = torch.randn(shape, generator=g).to(mod_dtype)
    scale = (torch.randn(shape, generator=g) * 0.5).to(mod_dtype)
    shift = torch.randn(shape, generator=g).to(mod_dtype)
    return [t.to(device) for t in (r, y, gate, scale, shift)]


def _check(outs, refs, dtype):
    for out, ref in zip(outs, refs, strict=True):
        assert out.dtype == dtype and out.shape == ref.shape
        assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,s,n", [(2, 5, 96), (1, 3, 257), (2, 1, 130), (1, 1, 33)])
def test_launch_matches_reference(b, s, n, dtype):
    seed = zlib.crc32(repr((b, s, n, dtype)).encode())  # deterministic per case
    args = _inputs(b, s, n, dtype, seed)
    _check(mod.launch(*args, eps=1e-6), mod.reference(*args, eps=1e-6), dtype)


def test_mixed_dtypes_and_3d_modulation():
    args = _inputs(2, 3, 200, torch.bfloat16, 11, mod_dtype=torch.float32, mod_3d=True)
    _check(mod.launch(*args, eps=1e-5), mod.reference(*args, eps=1e-5), torch.bfloat16)


@pytest.mark.parametrize("branch", [torch.bfloat16, torch.float16])
def test_float32_residual_stream_with_a_lower_precision_branch(branch):
    """r (and r_new) stay float32, the modulated norm comes out in y's dtype; judged against float64."""
    r, y, gate, scale, shift = _inputs(2, 7, 160, torch.float32, 31)
    y = y.to(branch)
    r_new, m = mod.launch(r, y, gate, scale, shift, eps=1e-6)
    assert r_new.dtype == torch.float32 and m.dtype == branch
    wide = [t.double() for t in (r, y, gate, scale, shift)]
    want_r = wide[0] + wide[2][:, None] * wide[1]
    want_m = torch.nn.functional.layer_norm(want_r, (160,), eps=1e-6) * (1 + wide[3][:, None]) + wide[4][:, None]
    assert rel_err(r_new, want_r) < TOL[torch.float32]  # not rounded to the branch's precision
    assert rel_err(m, want_m) < TOL[branch]
    ref_r, ref_m = mod.reference(r, y, gate, scale, shift, eps=1e-6)
    assert rel_err(r_new, ref_r) < TOL[torch.float32] and ref_m.dtype == branch and rel_err(m, ref_m) < TOL[branch]


def test_a_lower_precision_residual_with_a_float32_branch_is_refused():
    r, y, gate, scale, shift = _inputs(1, 2, 32, torch.bfloat16, 3)
    with pytest.raises(ValueError, match="float32 r"):
        mod.launch(r, y.float(), gate, scale, shift)


def test_chunked_modulation_views_and_noncontiguous_residual():
    g = torch.Generator().manual_seed(5)
    n = 96
    r = torch.randn(2, n, 4, generator=g).transpose(1, 2)
    y = torch.randn(2, 4, n, generator=g)
    shift, scale, gate = torch.randn(2, 3 * n, generator=g).chunk(3, dim=-1)
    assert not scale.is_contiguous() and not r.is_contiguous()
    outs = mod.launch(r, y, gate, scale, shift)
    assert all(o.is_contiguous() for o in outs)
    _check(outs, mod.reference(r, y, gate, scale, shift), torch.float32)


def test_gate_and_modulation_are_applied():
    """Fails for zeros, an ungated residual, or the unmodulated norm."""
    r, y, gate, scale, shift = _inputs(2, 3, 100, torch.float32, 21)
    r_new, m = mod.launch(r, y, gate, scale, shift)
    ref_r, ref_m = mod.reference(r, y, gate, scale, shift)
    zeros = torch.zeros_like(scale)
    _plain_r, plain_m = mod.reference(r, y, gate, zeros, zeros)
    assert rel_err(r_new, ref_r) < TOL[torch.float32] and rel_err(m, ref_m) < TOL[torch.float32]
    assert rel_err(r_new, r + y) > 0.1  # gate matters
    assert rel_err(m, plain_m) > 0.1  # modulation matters
    # The norm sees the updated residual, not the old one.
    _, stale_m = mod.reference(r, torch.zeros_like(y), gate, scale, shift)
    assert rel_err(m, stale_m) > 0.1
    # Per-batch parameters: swapping their batch rows changes both outputs.
    sw_r, sw_m = mod.launch(r, y, gate.flip(0), scale.flip(0), shift.flip(0))
    assert rel_err(sw_r, ref_r) > 0.1 and rel_err(sw_m, ref_m) > 0.1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_poisoned_outputs_fully_written(dtype):
    args = _inputs(2, 3, 257, dtype, 31)
    out = (torch.full_like(args[0], float("nan")), torch.full_like(args[0], float("nan")))
    res = mod.launch(*args, out=out)
    assert res[0] is out[0] and res[1] is out[1]
    assert not torch.isnan(out[0]).any() and not torch.isnan(out[1]).any()
    _check(out, mod.reference(*args), dtype)


def test_launcher_rejects_bad_inputs():
    r, y, gate, scale, shift = _inputs(2, 3, 64, torch.float32, 41)
    with pytest.raises(ValueError, match="r must be"):
        mod.launch(r[0], y[0], gate, scale, shift)
    with pytest.raises(ValueError, match="y must be shaped like r"):
        mod.launch(r, y[:, :2], gate, scale, shift)
    with pytest.raises(ValueError, match="y must be shaped like r"):
        mod.launch(r.to(torch.bfloat16), y.to(torch.float16), gate, scale, shift)
    with pytest.raises(ValueError, match="gate must have shape"):
        mod.launch(r, y, gate[:1], scale, shift)
    with pytest.raises(ValueError, match="out\\[1\\] must be"):
        mod.launch(r, y, gate, scale, shift, out=(torch.empty_like(r), torch.empty(2, 3, 63)))


def test_op_on_cpu_equals_reference():
    args = _inputs(2, 5, 96, torch.bfloat16, 51)
    r_new, m = torch.ops.kopt.gated_residual(*args, 1e-6)
    ref_r, ref_m = mod.reference(*args, 1e-6)
    assert torch.equal(r_new, ref_r) and torch.equal(m, ref_m)


def test_op_fake_tensor_mode(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("the fake implementation must not compute")

    monkeypatch.setattr(mod, "reference", boom)
    monkeypatch.setattr(mod, "launch", boom)
    with FakeTensorMode():
        r = torch.empty(2, 7, 96, dtype=torch.bfloat16)
        y = torch.empty(2, 7, 96, dtype=torch.bfloat16)
        p = torch.empty(2, 96, dtype=torch.bfloat16)
        outs = torch.ops.kopt.gated_residual(r, y, p, p, p, 1e-6)
    assert len(outs) == 2
    for o in outs:
        assert isinstance(o, FakeTensor)
        assert o.shape == (2, 7, 96) and o.dtype == torch.bfloat16


def test_op_compiles_fullgraph():
    args = _inputs(2, 5, 96, torch.float32, 61)

    def fn(r, y, gate, scale, shift):
        r_new, m = torch.ops.kopt.gated_residual(r, y, gate, scale, shift, 1e-6)
        return r_new * 2, m + 1

    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    ref_r, ref_m = mod.reference(*args)
    got_r, got_m = compiled(*args)
    torch.testing.assert_close(got_r, ref_r * 2)
    torch.testing.assert_close(got_m, ref_m + 1)


@pytest.mark.gpu
@needs_cuda
def test_gpu_production_shape():
    args = _inputs(1, 4096, 3072, torch.bfloat16, 71, device="cuda")
    refs = mod.reference(*args)
    out = (torch.full_like(args[0], float("nan")), torch.full_like(args[0], float("nan")))
    mod.launch(*args, out=out)
    assert not torch.isnan(out[0]).any() and not torch.isnan(out[1]).any()
    _check(out, refs, torch.bfloat16)
    _check(torch.ops.kopt.gated_residual(*args, 1e-6), refs, torch.bfloat16)


@pytest.mark.gpu
@needs_cuda
def test_gpu_op_under_compile():
    args = _inputs(1, 4096, 3072, torch.bfloat16, 81, device="cuda")
    fn = torch.compile(lambda *a: torch.ops.kopt.gated_residual(*a, 1e-6), fullgraph=True)
    _check(fn(*args), mod.reference(*args), torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_form_against_float64(dtype):
    """``rms=True`` (LTX-Video's seam): RMSNorm of the rounded residual, no weight; launch and spec both
    judged against float64."""
    r, y, gate, scale, shift = _inputs(2, 6, 136, dtype, 41)
    wide = [t.double() for t in (r, y, gate, scale, shift)]
    want_r = (wide[0] + wide[2][:, None] * wide[1]).to(dtype).double()  # the stored residual is rounded
    want_m = want_r * torch.rsqrt(want_r.square().mean(-1, keepdim=True) + 1e-6) * (1 + wide[3][:, None]) \
        + wide[4][:, None]
    for r_new, m in (mod.launch(r, y, gate, scale, shift, eps=1e-6, rms=True),
                     mod.reference(r, y, gate, scale, shift, eps=1e-6, rms=True)):
        assert rel_err(r_new, want_r) < TOL[dtype] and rel_err(m, want_m) < TOL[dtype]
    layer_norm = mod.reference(r, y, gate, scale, shift, eps=1e-6)[1]
    assert rel_err(layer_norm, want_m) > 10 * TOL[dtype]  # the flag changes what is computed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,s,n,rms", [(2, 5, 96, True), (1, 3, 257, False), (3, 7, 130, True)])
def test_without_a_gate_against_float64(b, s, n, rms, dtype):
    """``gate=None`` (HAS_GATE=False, LTX-Video's cross-attention add): ``r + y`` rounded to r's dtype,
    then the norm and modulation, under every launch config (rows of two batches in one program too);
    launch and spec judged against float64, and distinct from any gated result."""
    r, y, gate, scale, shift = _inputs(b, s, n, dtype, zlib.crc32(repr((b, s, n, rms, dtype)).encode()))
    wide = [t.double() for t in (r, y, scale, shift)]
    want_r = (wide[0] + wide[1]).to(dtype).double()  # the stored residual is rounded
    normed = (want_r * torch.rsqrt(want_r.square().mean(-1, keepdim=True) + 1e-6) if rms
              else torch.nn.functional.layer_norm(want_r, (n,), eps=1e-6))
    want_m = normed * (1 + wide[2][:, None]) + wide[3][:, None]
    runs = [mod.launch(r, y, None, scale, shift, eps=1e-6, rms=rms, config=c) for c in mod.candidates(n, b * s)]
    for r_new, m in [*runs, mod.reference(r, y, None, scale, shift, eps=1e-6, rms=rms)]:
        assert r_new.dtype == m.dtype == dtype
        assert rel_err(r_new, want_r) < TOL[dtype] and rel_err(m, want_m) < TOL[dtype]
    gated = mod.reference(r, y, gate, scale, shift, eps=1e-6, rms=rms)
    assert rel_err(runs[0][0], gated[0]) > 0.1 and rel_err(runs[0][1], gated[1]) > 0.1


def test_without_a_gate_poisoned_outputs_are_fully_written():
    r, y, _gate, scale, shift = _inputs(2, 3, 257, torch.bfloat16, 33)
    out = (torch.full_like(r, float("nan")), torch.full_like(r, float("nan")))
    mod.launch(r, y, None, scale, shift, out=out)
    assert not torch.isnan(out[0]).any() and not torch.isnan(out[1]).any()
    _check(out, mod.reference(r, y, None, scale, shift), torch.bfloat16)


def test_op_without_a_gate_on_cpu_under_fake_tensors_and_compile():
    """The schema takes ``Tensor? gate``: the op, its fake implementation and a fullgraph compile accept None."""
    r, y, _gate, scale, shift = _inputs(2, 5, 96, torch.bfloat16, 53)
    r_new, m = torch.ops.kopt.gated_residual(r, y, None, scale, shift, 1e-6, True)
    ref_r, ref_m = mod.reference(r, y, None, scale, shift, 1e-6, True)
    assert torch.equal(r_new, ref_r) and torch.equal(m, ref_m)
    with FakeTensorMode() as fake_mode:
        fakes = [fake_mode.from_tensor(t) for t in (r, y, scale, shift)]
        outs = torch.ops.kopt.gated_residual(fakes[0], fakes[1], None, fakes[2], fakes[3], 1e-6)
    assert [tuple(o.shape) for o in outs] == [(2, 5, 96)] * 2
    compiled = torch.compile(lambda *a: torch.ops.kopt.gated_residual(a[0], a[1], None, *a[2:], 1e-6, True),
                             backend="eager", fullgraph=True)
    for got, want in zip(compiled(r, y, scale, shift), (ref_r, ref_m), strict=True):
        assert torch.equal(got, want)


@pytest.mark.gpu
@needs_cuda
def test_gpu_without_a_gate_ltx_shape():
    r, y, _gate, scale, shift = _inputs(2, 6930, 2048, torch.bfloat16, 91, device="cuda")
    refs = mod.reference(r, y, None, scale, shift, rms=True)
    _check(mod.launch(r, y, None, scale, shift, rms=True), refs, torch.bfloat16)
    _check(torch.ops.kopt.gated_residual(r, y, None, scale, shift, 1e-6, True), refs, torch.bfloat16)
