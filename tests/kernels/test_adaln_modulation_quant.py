"""kopt::adaln_modulation_quant: the row kernel writing FP8 + row scales (interpreted on the CPU)
against its spec (the bf16 adaLN spec, then kopt.fp8 row quantization), under every launch config."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kopt.fp8.quantize import FP8
from kopt.kernels import adaln_modulation_quant as mod
from kopt.kernels._rows import row_candidates
from tests.kernels.fp8_checks import assert_fp8_matches

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _inputs(b, s, n, dtype, seed, rms=False, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(b, s, n, generator=g) * 2 + 0.5).to(dtype).to(device)
    scale = (torch.randn(b, n, generator=g) * 0.3).to(dtype).to(device)
    shift = (torch.randn(b, n, generator=g) * 0.3).to(dtype).to(device)
    weight = (torch.randn(n, generator=g) * 0.2 + 1).to(dtype).to(device) if rms else None
    return x, scale, shift, weight


@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_launch_config_matches_the_spec(rms, dtype):
    b, s, n = 2, 5, 40  # S not a multiple of the rows per program: programs straddle batches
    x, scale, shift, weight = _inputs(b, s, n, dtype, seed=11 + rms, rms=rms)
    q_ref, s_ref = mod.reference(x, scale, shift, weight, 1e-6, rms)
    for config in row_candidates(n, 16):
        q, scales = mod.launch(x, scale, shift, weight, 1e-6, rms, config=config)
        assert q.dtype == FP8 and q.shape == (b * s, n) and scales.shape == (b * s, 1)
        assert_fp8_matches(q, scales, q_ref, s_ref, exact=dtype == torch.float32)


def test_weight_without_rms_is_refused():
    x, scale, shift, _ = _inputs(1, 3, 16, torch.float32, seed=2)
    with pytest.raises(ValueError, match="only with rms=True"):
        mod.launch(x, scale, shift, torch.ones(16), 1e-6, False)


def test_fake_implementation_shapes():
    x, scale, shift, _ = _inputs(2, 3, 16, torch.bfloat16, seed=3)
    with FakeTensorMode() as fake_mode:
        q, s = torch.ops.kopt.adaln_modulation_quant(*(fake_mode.from_tensor(t) for t in (x, scale, shift)))
    assert (tuple(q.shape), q.dtype, tuple(s.shape), s.dtype) == ((6, 16), FP8, (6, 1), torch.float32)


@pytest.mark.gpu
@needs_cuda
def test_gpu_production_shape():
    x, scale, shift, _ = _inputs(1, 4096, 3072, torch.bfloat16, seed=4, device="cuda")
    q, s = torch.ops.kopt.adaln_modulation_quant(x, scale, shift)
    q_ref, s_ref = mod.reference(x, scale, shift)
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
    assert ((q.float() * s - q_ref.float() * s_ref).norm() / (q_ref.float() * s_ref).norm()).item() < 1e-2
