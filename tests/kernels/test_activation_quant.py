"""kopt::activation_quant: the Triton kernel (interpreted on the CPU) against its spec, which is the
unfused graph's SwiGLU + cat + row-wise FP8 quantization; fake implementation shapes."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import FakeTensorMode

from kopt.fp8.quantize import FP8
from kopt.kernels import activation_quant as mod
from kopt.kernels._rows import fp8_values
from tests.kernels.fp8_checks import assert_fp8_matches

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _inputs(shape, f, p, dtype, seed, device="cpu", act="swiglu"):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(*shape, 2 * f if act == "swiglu" else f, generator=g) * 3).to(dtype).to(device)
    prefix = None if p is None else (torch.randn(*shape, p, generator=g) * 0.5).to(dtype).to(device)
    return h, prefix


@triton.jit
def _fp8_values_kernel(x_ptr, out_ptr, scale, N: tl.constexpr):
    offsets = tl.arange(0, N)
    tl.store(out_ptr + offsets, fp8_values(tl.load(x_ptr + offsets), scale))


def _dequantized(q, scale):
    return q.float() * scale


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [None, 24])
@pytest.mark.parametrize("config", [{"BLOCK": 16, "num_warps": 1},  # two passes of several steps per row
                                    {"BLOCK": 64, "num_warps": 1}],  # one pass (the row fits)
                         ids=["two-pass", "one-pass"])
def test_kernel_matches_the_spec(act, dtype, p, config):
    h, prefix = _inputs((2, 5), 37, p, dtype, seed=3 + (p or 0), act=act)
    q, scale = mod.launch(h, prefix, act, config=config)
    q_ref, scale_ref = mod.reference(h, prefix, act)
    assert q.dtype == FP8 and q.shape == (10, 37 + (p or 0)) and scale.shape == (10, 1)
    # gelu: the kernel's exp form of tanh rounds differently from torch's near zero, which moves tiny
    # values across an fp8 step, so only SwiGLU in float32 is compared exactly
    assert_fp8_matches(q, scale, q_ref, scale_ref, exact=dtype == torch.float32 and act == "swiglu")


def test_spec_quantizes_like_kopt_fp8():
    """The spec is kopt.fp8.quantize (ROW) applied to cat([prefix, silu(h1) * h2])."""
    from kopt.fp8 import Granularity, quantize

    h, prefix = _inputs((3,), 8, 5, torch.bfloat16, seed=4)
    y = torch.cat([prefix, torch.nn.functional.silu(h[:, :8]) * h[:, 8:]], dim=-1)
    q, scale = quantize(y, Granularity.ROW)
    q_ref, scale_ref = mod.reference(h, prefix)
    assert torch.equal(q.float(), q_ref.float()) and torch.equal(scale, scale_ref)


def test_bad_inputs_are_refused_clearly():
    h, prefix = _inputs((2,), 8, 4, torch.float32, seed=5)
    with pytest.raises(ValueError, match="even last dim"):
        mod.launch(h[:, :15])
    with pytest.raises(ValueError, match="one of"):
        mod.launch(h, None, "relu")
    with pytest.raises(ValueError, match="must match h"):
        mod.launch(h, prefix.double())


def test_fake_implementation_shapes():
    h, prefix = _inputs((2, 3), 8, 4, torch.bfloat16, seed=6)
    with FakeTensorMode() as fake_mode:
        q, scale = torch.ops.kopt.activation_quant(fake_mode.from_tensor(h), fake_mode.from_tensor(prefix), "swiglu")
    assert (tuple(q.shape), q.dtype, tuple(scale.shape), scale.dtype) == ((6, 12), FP8, (6, 1), torch.float32)


@pytest.mark.gpu
@needs_cuda
def test_gpu_flux2_single_stream_shape():
    h, prefix = _inputs((1, 4608), 18432, 6144, torch.bfloat16, seed=7, device="cuda")
    q, scale = torch.ops.kopt.activation_quant(h, prefix, "swiglu")
    q_ref, scale_ref = mod.reference(h, prefix)
    torch.testing.assert_close(scale, scale_ref, rtol=1e-6, atol=0)
    deq, deq_ref = _dequantized(q, scale), _dequantized(q_ref, scale_ref)
    assert ((deq - deq_ref).norm() / deq_ref.norm()).item() < 1e-3  # silu's float32 order may differ


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("act, f, p", [("swiglu", 18432, 6144), ("gelu_tanh", 12288, None)], ids=["flux2", "qwen"])
def test_gpu_every_candidate_at_production_widths(act, f, p):
    """Every launch config on 1000 rows, at the production widths (a config that fails here would
    otherwise only be skipped by the autotuner)."""
    h, prefix = _inputs((1, 1000), f, p, torch.bfloat16, seed=8, device="cuda", act=act)
    q_ref, scale_ref = mod.reference(h, prefix, act)
    for config in mod.offered(f, p or 0):  # what the launcher tunes (IN_REGISTERS only where the row splits)
        q, scale = mod.launch(h, prefix, act, config=config)
        torch.testing.assert_close(scale, scale_ref, rtol=2**-6, atol=0, msg=lambda m, c=config: f"{c}: {m}")
        deq, deq_ref = _dequantized(q, scale), _dequantized(q_ref, scale_ref)
        assert ((deq - deq_ref).norm() / deq_ref.norm()).item() < 1e-2, config


@pytest.mark.gpu
@needs_cuda
def test_gpu_qwen_image_gelu_shape():
    """The PTX forms of exp2, reciprocal and bf16 rounding (kopt.kernels._fastmath) at Qwen-Image's width."""
    h, _ = _inputs((1, 4096), 12288, None, torch.bfloat16, seed=8, device="cuda", act="gelu_tanh")
    q, scale = torch.ops.kopt.activation_quant(h, None, "gelu_tanh")
    q_ref, scale_ref = mod.reference(h, None, "gelu_tanh")
    torch.testing.assert_close(scale, scale_ref, rtol=1e-2, atol=0)  # a row's max may round to another bf16
    deq, deq_ref = _dequantized(q, scale), _dequantized(q_ref, scale_ref)
    assert ((deq - deq_ref).norm() / deq_ref.norm()).item() < 5e-3


def test_register_chunk_configs_split_the_row_into_two_to_five_chunks():
    """IN_REGISTERS holds the row as 2..5 BLOCK-wide chunks: 12288 = 3 x 4096 (Qwen-Image) is offered,
    a config that would need one chunk or more than five is refused clearly when forced."""
    offered = [c for c in mod.offered(12288) if c.get("IN_REGISTERS")]
    assert {"BLOCK": 4096, "num_warps": 16, "IN_REGISTERS": 1} in offered
    assert all(2 <= -(-12288 // c["BLOCK"]) <= 5 for c in offered)
    h, _ = _inputs((3,), 100, None, torch.float32, seed=9, act="gelu_tanh")
    with pytest.raises(ValueError, match="chunks, not 2..5"):
        mod.launch(h, None, "gelu_tanh", config={"BLOCK": 2048, "num_warps": 8, "IN_REGISTERS": 1})
    h, prefix = _inputs((3,), 4 * 2048 + 7, 30, torch.bfloat16, seed=10)  # 5 chunks, the last one partial
    q, scale = mod.launch(h, prefix, "swiglu", config={"BLOCK": 2048, "num_warps": 8, "IN_REGISTERS": 1})
    q_ref, scale_ref = mod.reference(h, prefix, "swiglu")
    assert_fp8_matches(q, scale, q_ref, scale_ref, exact=False)


def test_register_chunks_read_a_prefix_wider_than_a_chunk_in_pieces():
    """The IN_REGISTERS kernel reads its prefix (only copied, not computed) in BLOCK-wide pieces,
    twice: a prefix of two pieces, the second partial, as FLUX.2's 6144-column prefix is for
    4096-column chunks. Its largest value sits in the second piece, so the scale comes from there."""
    h, prefix = _inputs((2,), 2 * 256 + 9, 256 + 77, torch.bfloat16, seed=11)  # 3 chunks of 256; prefix 2 pieces
    prefix[:, 256 + 40] = 200.0  # the row's amax (h is ~N(0, 9): its SwiGLU stays below), in the prefix's partial piece
    q, scale = mod.launch(h, prefix, "swiglu", config={"BLOCK": 256, "num_warps": 2, "IN_REGISTERS": 1})
    q_ref, scale_ref = mod.reference(h, prefix, "swiglu")
    assert torch.equal(scale_ref.flatten(), torch.full((2,), 200.0, dtype=torch.float32) / 448)
    assert_fp8_matches(q, scale, q_ref, scale_ref, exact=False)



@pytest.mark.gpu
@needs_cuda
def test_gpu_a_nan_input_stays_nan_in_the_fp8_values():
    """A NaN activation must not come out as a finite FP8 value (clamping with NaN-dropping min/max
    made it ±448): it stays NaN, so the GEMM carries it to the model's output as eager's would. On the
    GPU only: the interpreter's float8 cast turns NaN into a finite value itself."""
    h, prefix = _inputs((2, 5), 37, 24, torch.float32, seed=11, device="cuda")
    h[0, 3, 7] = float("nan")  # the gate input of row 3, output column 7
    prefix[1, 1, 2] = float("nan")  # a prefix value of row 6
    q, scale = mod.launch(h, prefix, "swiglu")
    values = q.float()
    assert torch.isnan(values[3, 24 + 7]) and torch.isnan(values[6, 2])
    assert torch.isnan(values).sum() == 2 and torch.isfinite(scale).all()  # other values and scales as before


def test_fp8_values_keep_a_nan_and_clamp_the_rest():
    """The helper every hand-written FP8 kernel quantizes with, before the cast: NaN stays NaN (where
    Triton's default min/max would return the bound), infinities and large values clamp to ±448."""
    x = torch.tensor([1.0, float("nan"), -float("nan"), float("inf"), -float("inf"), 1e6, -1e6, -2.5])
    out = torch.empty_like(x)
    _fp8_values_kernel[(1,)](x, out, 0.5, N=8)
    assert torch.isnan(out[1:3]).all() and not torch.isnan(out[[0, *range(3, 8)]]).any()
    torch.testing.assert_close(out[[0, 3, 4, 5, 6, 7]], torch.tensor([2.0, 448.0, -448.0, 448.0, -448.0, -5.0]))
