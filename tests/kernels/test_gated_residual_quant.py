"""kopt::gated_residual_quant: residual stream in bf16 plus the modulated norm as FP8 + row scales
(interpreted on the CPU) against its spec, under every launch config."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kopt.fp8.quantize import FP8
from kopt.kernels import gated_residual_quant as mod
from kopt.kernels._rows import row_candidates
from tests.conftest import rel_err
from tests.kernels.fp8_checks import assert_fp8_matches

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _inputs(b, s, n, dtype, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    r = (torch.randn(b, s, n, generator=g) * 2).to(dtype).to(device)
    y = (torch.randn(b, s, n, generator=g) + 0.5).to(dtype).to(device)
    vectors = [(torch.randn(b, n, generator=g) * 0.3).to(dtype).to(device) for _ in range(3)]
    return (r, y, *vectors)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_launch_config_matches_the_spec(dtype):
    args = _inputs(2, 5, 40, dtype, seed=21)
    r_ref, q_ref, s_ref = mod.reference(*args)
    for config in row_candidates(40, 16):
        r_new, q, scales = mod.launch(*args, config=config)
        assert q.dtype == FP8 and q.shape == (10, 40) and scales.shape == (10, 1) and r_new.shape == (2, 5, 40)
        assert rel_err(r_new, r_ref) < (1e-6 if dtype == torch.float32 else 1e-2)
        assert_fp8_matches(q, scales, q_ref, s_ref, exact=dtype == torch.float32)


def test_fake_implementation_shapes():
    args = _inputs(2, 3, 16, torch.bfloat16, seed=22)
    with FakeTensorMode() as fake_mode:
        r_new, q, s = torch.ops.kopt.gated_residual_quant(*(fake_mode.from_tensor(t) for t in args))
    assert (tuple(r_new.shape), tuple(q.shape), q.dtype, tuple(s.shape)) == ((2, 3, 16), (6, 16), FP8, (6, 1))


@pytest.mark.gpu
@needs_cuda
def test_gpu_production_shape():
    args = _inputs(1, 4096, 3072, torch.bfloat16, seed=23, device="cuda")
    r_new, q, s = torch.ops.kopt.gated_residual_quant(*args)
    r_ref, q_ref, s_ref = mod.reference(*args)
    assert rel_err(r_new, r_ref) < 1e-2
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
    assert rel_err(q.float() * s, q_ref.float() * s_ref) < 1e-2


def test_rms_norm_form_under_every_launch_config():
    args = _inputs(2, 5, 40, torch.bfloat16, seed=23)
    r_ref, q_ref, s_ref = mod.reference(*args, rms=True)
    for config in row_candidates(40, 16):
        r_new, q, scales = mod.launch(*args, config=config, rms=True)
        assert rel_err(r_new, r_ref) < 1e-2
        assert_fp8_matches(q, scales, q_ref, s_ref, exact=False)


def test_without_a_gate_under_every_launch_config():
    """``gate=None`` (HAS_GATE=False): ``r + y``, then the FP8 rows of the modulated RMSNorm, as the spec."""
    r, y, _gate, scale, shift = _inputs(2, 5, 40, torch.bfloat16, seed=24)
    r_ref, q_ref, s_ref = mod.reference(r, y, None, scale, shift, rms=True)
    assert rel_err(r_ref, r.double() + y.double()) < 1e-2
    for config in row_candidates(40, 16):
        r_new, q, scales = mod.launch(r, y, None, scale, shift, config=config, rms=True)
        assert rel_err(r_new, r_ref) < 1e-2
        assert_fp8_matches(q, scales, q_ref, s_ref, exact=False)
    r_op, q_op, s_op = torch.ops.kopt.gated_residual_quant(r, y, None, scale, shift, 1e-6, True)
    assert torch.equal(r_op, r_ref) and torch.equal(q_op.float(), q_ref.float()) and torch.equal(s_op, s_ref)
