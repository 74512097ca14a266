"""kopt::fp8_gemv: the Triton kernel (interpreted on the CPU) under every config against its spec,
the spec against ``torch._scaled_mm``, input checks, the fake implementation, and on a GPU the
production shape (Qwen-Image's merged modulation GEMM, cut to fit a test)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kopt.fp8.config import Granularity
from kopt.fp8.quantize import FP8, Operand, quantize
from kopt.kernels import fp8_gemv as mod
from tests.conftest import rel_err

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _operands(m, n, k, seed, device="cpu", bias=True):
    """Row-quantized x (M, K) and weight (N, K) as fp8-linear makes them, with (1, N) weight scales."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * 3
    w = torch.randn(n, k, generator=g) * 0.05
    q_x, x_scale = quantize(x, Granularity.ROW, Operand.ACTIVATION)
    q_w, w_scale = quantize(w, Granularity.ROW, Operand.WEIGHT)
    b = (torch.randn(n, generator=g) * 0.1).to(torch.bfloat16) if bias else None
    moved = [t.to(device) if t is not None else None for t in (q_x, x_scale, q_w, w_scale.t().contiguous(), b)]
    return moved, x @ w.t() + (b.float() if bias else 0)


@pytest.mark.parametrize("m", [1, 3])
def test_every_kernel_config_matches_the_spec(m):
    """Every Triton config, N and K not multiples of any block (masked tails), M programs per block."""
    (q_x, x_scale, q_w, w_scale, b), _ = _operands(m, 77, 300, seed=m)
    ref = mod.reference(q_x, x_scale, q_w, w_scale, b, torch.bfloat16)
    for config in mod.candidates()[1:]:
        out = mod.launch(q_x, x_scale, q_w, w_scale, b, torch.bfloat16, config=config)
        assert out.shape == (m, 77) and out.dtype == torch.bfloat16
        assert rel_err(out, ref) < 1e-2, config
    out = mod.launch(q_x, x_scale, q_w, w_scale, None, torch.float32, config=mod.candidates()[1])
    assert rel_err(out, mod.reference(q_x, x_scale, q_w, w_scale, None, torch.float32)) < 1e-5


def test_spec_is_scaled_mm_and_close_to_the_bf16_linear():
    """The spec computes what ``_scaled_mm`` computes with row scales (CPU has it for FP8), and both
    are the unquantized linear up to FP8's error."""
    (q_x, x_scale, q_w, w_scale, b), exact = _operands(2, 48, 96, seed=5)
    spec = mod.reference(q_x, x_scale, q_w, w_scale, b, torch.float32)
    scaled = torch._scaled_mm(q_x, q_w.t(), x_scale, w_scale, out_dtype=torch.float32) + b.float()
    assert rel_err(spec, scaled) < 1e-6
    assert rel_err(spec, exact) < 0.06


def test_the_first_candidate_is_cublas():
    """Nothing timed (CPU, ``KOPT_AUTOTUNE=0``) keeps cuBLAS: the kernel is used only where it measured faster."""
    assert mod.candidates()[0] == mod.CUBLAS
    assert all(8 <= c["BLOCK_N"] * c["BLOCK_K"] // (32 * c["num_warps"]) <= 64 for c in mod.candidates()[1:])


def test_bad_inputs_are_refused_clearly():
    (q_x, x_scale, q_w, w_scale, b), _ = _operands(1, 16, 32, seed=6)
    with pytest.raises(ValueError, match="1..4"):
        mod.launch(torch.cat([q_x.float()] * 5).to(FP8), torch.ones(5, 1), q_w, w_scale, b, torch.bfloat16)
    with pytest.raises(ValueError, match="row-wise scales"):
        mod.launch(q_x, x_scale, q_w, w_scale.t(), b, torch.bfloat16)
    with pytest.raises(ValueError, match="must be torch.float8_e4m3fn"):
        mod.launch(q_x.float(), x_scale, q_w, w_scale, b, torch.bfloat16)
    with pytest.raises(ValueError, match="bias"):
        mod.launch(q_x, x_scale, q_w, w_scale, b[:3], torch.bfloat16)


def test_op_on_cpu_is_the_spec_and_fake_shapes():
    (q_x, x_scale, q_w, w_scale, b), _ = _operands(2, 24, 64, seed=7)
    out = torch.ops.kopt.fp8_gemv(q_x, x_scale, q_w, w_scale, b, torch.bfloat16, True)
    assert torch.equal(out, mod.reference(q_x, x_scale, q_w, w_scale, b, torch.bfloat16))
    with FakeTensorMode() as fake_mode:
        fakes = [fake_mode.from_tensor(t) for t in (q_x, x_scale, q_w, w_scale, b)]
        fake = torch.ops.kopt.fp8_gemv(*fakes, torch.float16, False)
    assert fake.shape == (2, 24) and fake.dtype == torch.float16


@needs_cuda
@pytest.mark.gpu
def test_gpu_modulation_shape_every_config_and_the_tuned_op():
    """One timestep embedding times 65536 modulation rows of K = 3072 (Qwen-Image's merged weight has
    2.2 M): every config, and the op as the pass calls it (tuned against cuBLAS), match the spec."""
    (q_x, x_scale, q_w, w_scale, b), _ = _operands(1, 65536, 3072, seed=8, device="cuda")
    ref = mod.reference(q_x, x_scale, q_w, w_scale, b, torch.bfloat16)
    for config in mod.candidates():
        out = mod.launch(q_x, x_scale, q_w, w_scale, b, torch.bfloat16, True, config=config)
        assert rel_err(out, ref) < 1e-2, config
    assert rel_err(torch.ops.kopt.fp8_gemv(q_x, x_scale, q_w, w_scale, b, torch.bfloat16, True), ref) < 1e-2
