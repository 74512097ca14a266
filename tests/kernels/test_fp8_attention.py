"""kopt::fp8_attention: the Triton kernels (interpreted on the CPU) against the spec, the spec
against exact attention, key masks, the fake implementation's layout, refused inputs; on a GPU,
every launch config at production shapes against the spec and against torch's SDPA."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kopt.kernels import fp8_attention as mod
from kopt.kernels._autotune import config_name
from tests.conftest import rel_err

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _on_grid(*shape, row_scale, generator):
    """Values whose FP8 quantization (per row, or per tile of rows sharing a scale) is exact: FP8
    numbers times a scale per row, each row reaching ±448 · scale. Then the kernel and the spec differ
    only by the kernel's FP8 rounding of P."""
    x = (torch.randn(*shape, generator=generator) * 100).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    x[..., 0] = 448.0
    return x * row_scale


def _inputs(b, h, s_q, s_k, d, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = _on_grid(b, h, s_q, d, row_scale=torch.rand(b, h, s_q, 1, generator=g) * 0.01, generator=g)
    # one scale for K and one for V: every key tile's amax is 448 · scale, whatever the kernel's tile
    k = _on_grid(b, h, s_k, d, row_scale=0.006, generator=g)
    v = _on_grid(b, h, s_k, d, row_scale=0.003, generator=g)
    bias = torch.randn(b, s_k, generator=g)
    bias[:, s_k - s_k // 5:] = float("-inf")  # padded keys, as Qwen-Image's text mask gives
    to = lambda t: t.to(device)  # noqa: E731
    return to(q), to(k), to(v), to(bias)


def test_spec_is_exact_attention_when_quantization_is_exact():
    q, k, v, bias = _inputs(2, 2, 33, 47, 32, seed=1)
    exact = torch.softmax(q @ k.transpose(-1, -2) * 0.3 + bias[:, None, None, :], -1) @ v
    assert rel_err(mod.reference(q, k, v, bias, 0.3), exact) < 1e-5


def test_spec_error_on_random_inputs_is_fp8_sized():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 64, 64, generator=g) for _ in range(3))
    exact = torch.softmax(q @ k.transpose(-1, -2) / 8, -1) @ v
    error = rel_err(mod.reference(q, k, v), exact)
    assert 1e-3 < error < 0.1


@pytest.mark.parametrize("config", mod.candidates(), ids=config_name)
@pytest.mark.parametrize("keys", [90, 128])  # a partial last key tile (masked), and whole tiles only
def test_kernel_matches_the_spec_for_every_config(config, keys):
    q, k, v, bias = _inputs(2, 2, 70, keys, 64, seed=3)
    padding_only = torch.where(torch.isinf(bias), bias, 0.0)  # zero on whole key tiles, -inf after
    padded = (keys - keys // 5, keys)  # where padding_only may be nonzero: the window the pass would prove
    for b, window in ((None, None), (bias, None), (padding_only, None), (padding_only, padded)):
        out = mod.launch(q, k, v, b, 0.125, config=config, bias_window=window)
        assert out.shape == q.shape and out.stride() == mod.empty_output(q).stride()
        # the P rounding to FP8 is the kernel's only difference from the spec (≈ 2 % here)
        assert rel_err(out, mod.reference(q, k, v, b, 0.125, block_n=config["BLOCK_N"])) < 0.03


def test_masked_keys_do_not_matter():
    q, k, v, bias = _inputs(1, 2, 20, 40, 32, seed=4)
    config = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1}
    out = mod.launch(q, k, v, bias, None, config=config)
    masked = torch.isinf(bias)[:, None, :, None].expand_as(k)
    k2, v2 = k.clone(), v.clone()
    k2[masked] = -k[masked]  # negated: every K and V tile keeps its amax, hence its scale
    v2[masked] = -v[masked]
    assert torch.equal(mod.launch(q, k2, v2, bias, None, config=config), out)


def test_strided_inputs_as_the_model_passes_them():
    """(B, S, H, D) projections viewed as (B, H, S, D), the layout a DiT hands to SDPA."""
    q, k, v, _ = _inputs(1, 3, 24, 24, 32, seed=5)
    q_s, k_s, v_s = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    config = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1}
    assert torch.equal(mod.launch(q_s, k_s, v_s, config=config), mod.launch(q, k, v, config=config))


def test_fake_implementation_layout():
    q, k, v, bias = _inputs(1, 2, 16, 24, 32, seed=6)
    with FakeTensorMode() as fake_mode:
        out = torch.ops.kopt.fp8_attention(*(fake_mode.from_tensor(t) for t in (q, k, v, bias)), 0.1)
    assert out.shape == q.shape and out.stride() == mod.empty_output(q).stride()


def test_bad_inputs_are_refused_clearly():
    q, k, v, bias = _inputs(1, 2, 16, 24, 32, seed=7)
    with pytest.raises(ValueError, match="head dim"):
        mod.launch(q[..., :16], k[..., :16], v[..., :16])
    with pytest.raises(ValueError, match="equal"):
        mod.launch(q, k, v[:, :, :5])
    with pytest.raises(ValueError, match="key mask"):
        mod.launch(q, k, v, bias[:, :5])
    with pytest.raises(ValueError, match="bias window"):
        mod.launch(q, k, v, bias, bias_window=(3, 25))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("config", mod.candidates(), ids=config_name)
def test_gpu_production_shapes_every_config(config):
    # FLUX.2: 48 heads, 4096 + 512 tokens; Qwen-Image: 24 heads, 4096 + 256 tokens with a key mask
    # (and 1000 tokens: a partial last key tile)
    for b, h, s, with_bias in ((1, 48, 4608, False), (1, 24, 4352, True), (2, 8, 1000, True)):
        g = torch.Generator(device="cuda").manual_seed(h)
        q, k, v = (torch.randn(b, s, h, 128, device="cuda", generator=g).bfloat16().transpose(1, 2) for _ in range(3))
        bias = torch.zeros(b, s, device="cuda", dtype=torch.bfloat16)
        bias[:, s - 100:] = float("-inf")
        bias = bias if with_bias else None
        out = mod.launch(q, k, v, bias, None, config=config)
        spec = mod.reference(q, k, v, bias, None, block_n=config["BLOCK_N"])
        assert rel_err(out, spec) < 0.03
        if bias is not None:  # the mask only where it is nonzero, as the pass proves it: three key loops
            windowed = mod.launch(q, k, v, bias, None, config=config, bias_window=(s - 100, s))
            assert rel_err(windowed, spec) < 0.03
        mask = None if bias is None else bias.float()[:, None, None, :]
        exact = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
        assert rel_err(out, exact) < 0.1


@pytest.mark.parametrize("split", [30, 64])  # inside a key tile, and on a tile boundary
def test_values_in_two_parts_are_read_as_their_concatenation(split):
    """A joint attention's text and image values: v_tail saves materializing cat([v, v_tail])."""
    q, k, v, bias = _inputs(1, 2, 40, 90, 32, seed=8)
    head = v[:, :, :split].transpose(1, 2).contiguous().transpose(1, 2)  # strided, as the model's views are
    tail = v[:, :, split:].clone()
    config = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1}
    joined = mod.launch(q, k, head, bias, 0.2, config=config, v_tail=tail)
    assert torch.equal(joined, mod.launch(q, k, v, bias, 0.2, config=config))
    op = torch.ops.kopt.fp8_attention(q, k, head, bias, 0.2, v_tail=tail)  # the CPU spec path
    assert torch.equal(op, torch.ops.kopt.fp8_attention(q, k, v, bias, 0.2))
    with pytest.raises(ValueError, match="v_tail"):
        mod.launch(q, k, head, bias, 0.2, v_tail=tail[..., :16])
    with pytest.raises(ValueError, match="equal"):
        mod.launch(q, k, head, bias, 0.2, v_tail=tail[:, :, 1:])
