"""kopt::fp8_attention_quant: the FP8-output attention kernel (interpreted on the CPU) against its
spec for every launch config, the bound its scale relies on, the fake implementation; on a GPU, the
production shapes against the spec and against exact attention."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kopt.fp8.quantize import FP8
from kopt.kernels import fp8_attention as attention
from kopt.kernels import fp8_attention_quant as mod
from kopt.kernels._autotune import config_name
from tests.conftest import rel_err
from tests.kernels.test_fp8_attention import _inputs

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _dequantized(o8: torch.Tensor, row_scale: torch.Tensor) -> torch.Tensor:
    return o8.float() * row_scale[:, None, :, None]


@pytest.mark.parametrize("config", attention.candidates(), ids=config_name)
def test_kernel_matches_the_spec_for_every_config(config):
    q, k, v, bias = _inputs(2, 3, 70, 90, 64, seed=11)
    v = v * torch.tensor([1.0, 3.0])[:, None, None, None]  # batches with different scales
    o8, row_scale = attention.launch(q, k, v, bias, 0.125, config=config, fp8_out=True)
    spec8, spec_scale = mod.reference(q, k, v, bias, 0.125, block_n=config["BLOCK_N"])
    assert o8.dtype == FP8 and o8.shape == q.shape and o8.stride() == attention.empty_output(q, FP8).stride()
    assert row_scale.shape == (2, 70) and torch.equal(row_scale, spec_scale)
    assert torch.equal(row_scale[:, 0], mod.output_scale(v))
    # the output's own FP8 rounding against the same kernel's float output (2.5 % here) ...
    float_out = attention.launch(q, k, v, bias, 0.125, config=config)
    assert rel_err(_dequantized(o8, row_scale), float_out) < 0.03
    # ... and against the spec, which the kernel's FP8 rounding of P also separates it from (4.7 % here)
    assert rel_err(_dequantized(o8, row_scale), _dequantized(spec8, spec_scale)) < 0.06


def test_the_scale_bounds_every_output_without_clamping():
    """Softmax weights sum to one: no output exceeds max |V| (times the headroom for P's rounding)."""
    g = torch.Generator().manual_seed(12)
    q, k = (torch.randn(1, 4, 200, 32, generator=g) for _ in range(2))
    v = torch.randn(1, 4, 200, 32, generator=g) * 3
    o8, row_scale = mod.reference(q, k, v)
    exact = torch.softmax(q @ k.transpose(-1, -2) / 32**0.5, -1) @ v
    assert exact.abs().max() <= v.abs().max()
    assert (o8.float().abs() < 448).all()  # nothing saturated
    # the output's FP8 rounding on top of the spec's float output: FP8-sized, though one scale serves all rows
    assert rel_err(_dequantized(o8, row_scale), attention.reference(q, k, v)) < 0.03
    assert rel_err(_dequantized(o8, row_scale), exact) < 0.1


def test_op_on_the_cpu_and_its_fake():
    q, k, v, bias = _inputs(1, 2, 16, 24, 32, seed=13)
    o8, row_scale = torch.ops.kopt.fp8_attention_quant(q, k, v, bias, 0.1)
    spec8, spec_scale = mod.reference(q, k, v, bias, 0.1)
    assert torch.equal(o8.float(), spec8.float()) and torch.equal(row_scale, spec_scale)
    with FakeTensorMode() as fake_mode:
        fakes = (fake_mode.from_tensor(t) for t in (q, k, v, bias))
        fake8, fake_scale = torch.ops.kopt.fp8_attention_quant(*fakes, 0.1)
    assert (fake8.shape, fake8.stride(), fake8.dtype) == (o8.shape, o8.stride(), FP8)
    assert (fake_scale.shape, fake_scale.dtype) == (row_scale.shape, torch.float32)
    with pytest.raises(ValueError, match="head dim"):
        torch.ops.kopt.fp8_attention_quant(q[..., :16], k[..., :16], v[..., :16], None, 0.1)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("config", attention.candidates(), ids=config_name)
def test_gpu_production_shapes_every_config(config):
    """Qwen-Image's shape (24 heads, 256 text + 4096 image tokens, text mask) and a partial key tile."""
    for b, h, s in ((1, 24, 4352), (2, 8, 1000)):
        g = torch.Generator(device="cuda").manual_seed(h)
        q, k, v = (torch.randn(b, s, h, 128, device="cuda", generator=g).bfloat16().transpose(1, 2) for _ in range(3))
        bias = torch.zeros(b, s, device="cuda", dtype=torch.bfloat16)
        bias[:, 200:256] = float("-inf")
        o8, row_scale = attention.launch(q, k, v, bias, None, config=config, bias_window=(0, 256), fp8_out=True)
        spec8, spec_scale = mod.reference(q, k, v, bias, None, block_n=config["BLOCK_N"])
        torch.testing.assert_close(row_scale, spec_scale, rtol=1e-6, atol=0)
        # the output's own FP8 rounding (against the kernel's bf16 output), then against the spec (larger:
        # the kernel's rounding of P, and the two outputs' separate FP8 roundings)
        float_out = attention.launch(q, k, v, bias, None, config=config, bias_window=(0, 256))
        assert rel_err(_dequantized(o8, row_scale), float_out) < 0.03
        assert rel_err(_dequantized(o8, row_scale), _dequantized(spec8, spec_scale)) < 0.06
        exact = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                                 attn_mask=bias.float()[:, None, None, :])
        assert rel_err(_dequantized(o8, row_scale), exact) < 0.1
