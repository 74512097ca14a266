"""kopt::qk_norm_rope: the Triton launcher (interpreted on CPU) against the eager spec, the spec
against diffusers' own RMSNorm + RoPE functions, and the op under FakeTensor / torch.compile."""

from __future__ import annotations

import zlib

import pytest
import torch
from diffusers.models.embeddings import apply_rotary_emb, get_1d_rotary_pos_embed
from diffusers.models.normalization import RMSNorm
from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from kopt.kernels import qk_norm_rope as mod
from tests.conftest import rel_err

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
EPS = 1e-6
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _tables(s, d, mode, g, device="cpu"):
    """(cos, sin, freqs): complex -> strided (S, D/2) views of a complex64 freqs_cis (as Qwen-Image);
    real -> diffusers' repeat-interleaved (S, D) tables (as FLUX.2), freqs = (cos, sin)."""
    pos = torch.randint(0, 64, (s,), generator=g).double()
    if mode == "complex":
        angles = torch.outer(pos, 1.0 / 10000 ** (torch.arange(0, d, 2).double() / d)).float()
        freqs = torch.polar(torch.ones_like(angles), angles).to(device)
        cos, sin = mod.cos_sin_from_complex(freqs)
        return cos, sin, freqs
    cos, sin = get_1d_rotary_pos_embed(d, pos, theta=2000, use_real=True, repeat_interleave_real=True)
    cos, sin = cos.float().to(device), sin.float().to(device)
    return cos, sin, (cos, sin)


def _inputs(b, s, h, d, dtype, mode, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(b, s, h, d, generator=g) * 2 + 0.3).to(dtype).to(device)
    weight = (torch.randn(d, generator=g) * 0.2 + 1).to(dtype).to(device)
    cos, sin, _ = _tables(s, d, mode, g, device)
    return x, weight, cos, sin


def _seed(*key):
    return zlib.crc32(repr(key).encode())


@pytest.mark.parametrize("mode", ["complex", "real"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# the last shape: heads flattened
@pytest.mark.parametrize("b,s,h,d", [(2, 5, 2, 64), (1, 5, 3, 48), (1, 3, 1, 2), (1, 4, 1, 512)])
def test_launch_matches_reference(b, s, h, d, dtype, mode):
    x, weight, cos, sin = _inputs(b, s, h, d, dtype, mode, _seed(b, s, h, d, dtype, mode))
    out = mod.launch(x, weight, cos, sin, EPS, mode)
    ref = mod.reference(x, weight, cos, sin, EPS, mode)
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_err(out, ref) < TOL[dtype]


@pytest.mark.parametrize("mode", ["complex", "real"])
def test_every_candidate_with_and_without_one_token_per_program(mode):
    """H = 6 heads: programs of 2 rows hold one token's heads and load its RoPE row once
    (ONE_TOKEN); programs of 4 or more rows straddle tokens and load a table row per head. Every
    candidate, both ways, on a batch of 2 (the token index wraps at S) with a partial last program."""
    b, s, h, d = 2, 5, 6, 128
    x, weight, cos, sin = _inputs(b, s, h, d, torch.float32, mode, _seed("one-token", mode))
    ref = mod.reference(x, weight, cos, sin, EPS, mode)
    configs = mod.candidates(d // 2, b * s * h)
    shared = {c["ROWS_PER_PROGRAM"] for c in configs if h % c["ROWS_PER_PROGRAM"] == 0}
    assert 2 in shared and any(h % c["ROWS_PER_PROGRAM"] for c in configs)
    for config in configs:
        out = mod.launch(x, weight, cos, sin, EPS, mode, config=config)
        assert rel_err(out, ref) < TOL[torch.float32], config


@pytest.mark.parametrize("mode", ["complex", "real"])
def test_no_weight_and_strided_q_from_fused_qkv(mode):
    """q as a view into a fused (B, S, 3*H*D) projection: strides are read, nothing is copied."""
    b, s, h, d = 2, 5, 2, 32
    g = torch.Generator().manual_seed(_seed("qkv", mode))
    qkv = torch.randn(b, s, 3 * h * d, generator=g)
    q = qkv[..., h * d : 2 * h * d].unflatten(-1, (h, d))
    assert not q.is_contiguous()
    cos, sin, _ = _tables(s, d, mode, g)
    out = mod.launch(q, None, cos, sin, EPS, mode)
    assert rel_err(out, mod.reference(q, None, cos, sin, EPS, mode)) < TOL[torch.float32]


def test_reference_matches_diffusers_qwen_complex():
    """Qwen-Image: diffusers RMSNorm, then apply_rotary_emb_qwen(use_real=False) on complex freqs."""
    b, s, h, d = 2, 5, 3, 64
    g = torch.Generator().manual_seed(_seed("qwen"))
    x = torch.randn(b, s, h, d, generator=g) * 2
    cos, sin, freqs = _tables(s, d, "complex", g)
    norm = RMSNorm(d, eps=EPS)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(d, generator=g) * 0.2 + 1)
        expected = apply_rotary_emb_qwen(norm(x), freqs, use_real=False)
    got = mod.reference(x, norm.weight.detach(), cos, sin, EPS, "complex")
    assert rel_err(got, expected) < 1e-6
    # the launcher agrees with diffusers too (through the zero-copy .real / .imag views)
    assert rel_err(mod.launch(x, norm.weight.detach(), cos, sin, EPS, "complex"), expected) < TOL[torch.float32]


def test_reference_matches_diffusers_flux2_real():
    """FLUX.2: torch.nn.RMSNorm, then apply_rotary_emb(use_real=True, unbind_dim=-1, sequence_dim=1)."""
    b, s, h, d = 2, 5, 3, 64
    g = torch.Generator().manual_seed(_seed("flux2"))
    x = torch.randn(b, s, h, d, generator=g) * 2
    cos, sin, freqs = _tables(s, d, "real", g)
    norm = torch.nn.RMSNorm(d, eps=EPS)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(d, generator=g) * 0.2 + 1)
        expected = apply_rotary_emb(norm(x), freqs, use_real=True, use_real_unbind_dim=-1, sequence_dim=1)
    got = mod.reference(x, norm.weight.detach(), cos, sin, EPS, "real")
    assert rel_err(got, expected) < 1e-6
    assert rel_err(mod.launch(x, norm.weight.detach(), cos, sin, EPS, "real"), expected) < TOL[torch.float32]


@pytest.mark.parametrize("mode", ["complex", "real"])
def test_rotation_is_applied(mode):
    """Fails for a kernel that skips the rotation, returns zeros, or rotates the wrong pairs."""
    b, s, h, d = 1, 5, 2, 32
    x, weight, cos, sin = _inputs(b, s, h, d, torch.float32, mode, _seed("rot", mode))
    out = mod.launch(x, weight, cos, sin, EPS, mode)
    ref = mod.reference(x, weight, cos, sin, EPS, mode)
    norm_only = torch.nn.functional.rms_norm(x, (d,), weight, EPS)
    assert rel_err(out, ref) < TOL[torch.float32]
    assert rel_err(norm_only, ref) > 0.1
    assert rel_err(torch.zeros_like(ref), ref) == 1.0
    # half-split pairs (use_real_unbind_dim=-2) are a different rotation: must not match
    full_cos = cos.repeat_interleave(2, dim=-1) if mode == "complex" else cos
    full_sin = sin.repeat_interleave(2, dim=-1) if mode == "complex" else sin
    wrong = apply_rotary_emb(norm_only, (full_cos, full_sin), use_real_unbind_dim=-2, sequence_dim=1)
    assert rel_err(wrong, ref) > 0.1


@pytest.mark.parametrize("mode", ["complex", "real"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_poisoned_out_fully_overwritten(mode, dtype):
    x, weight, cos, sin = _inputs(2, 5, 3, 48, dtype, mode, _seed("nan", mode, dtype))
    out = torch.full_like(x, float("nan"))
    ret = mod.launch(x, weight, cos, sin, EPS, mode, out=out)
    assert ret is out
    assert not torch.isnan(out).any()
    assert rel_err(out, mod.reference(x, weight, cos, sin, EPS, mode)) < TOL[dtype]


def test_launch_validates_inputs():
    x, weight, cos, sin = _inputs(1, 5, 2, 32, torch.float32, "complex", 1)
    with pytest.raises(ValueError, match="mode"):
        mod.launch(x, weight, cos, sin, EPS, "polar")
    with pytest.raises(ValueError, match="cos must have shape"):
        mod.launch(x, weight, cos, sin, EPS, "real")  # real wants (S, D) tables
    with pytest.raises(ValueError, match="float32"):
        mod.launch(x, weight, cos.double(), sin, EPS, "complex")
    with pytest.raises(ValueError, match="even"):
        mod.launch(x[..., :31], None, cos, sin, EPS, "complex")
    with pytest.raises(ValueError, match="unit stride"):
        mod.launch(x.transpose(2, 3), None, cos, sin, EPS, "complex")
    with pytest.raises(ValueError, match="weight"):
        mod.launch(x, weight[:16], cos, sin, EPS, "complex")
    with pytest.raises(ValueError, match="out"):
        mod.launch(x, weight, cos, sin, EPS, "complex", out=torch.empty(1, 5, 2, 32, dtype=torch.bfloat16))


def test_candidates_start_with_the_heuristic_default():
    many = mod.candidates(64, 1 << 17)
    assert many[0] == mod.default_config(64, 1 << 17)
    assert many[0]["BLOCK_HALF"] == 64 and many[0]["ROWS_PER_PROGRAM"] * 64 >= 1024
    assert len({tuple(sorted(c.items())) for c in many}) == len(many) > 4
    few = mod.candidates(64, 3)  # no more rows per program than the bucket of rows (4), except the default
    assert all(c["ROWS_PER_PROGRAM"] <= 4 for c in few[1:])


@pytest.mark.parametrize("mode", ["complex", "real"])
def test_op_on_cpu_equals_reference(mode):
    x, weight, cos, sin = _inputs(2, 5, 2, 32, torch.bfloat16, mode, _seed("op", mode))
    out = torch.ops.kopt.qk_norm_rope(x, weight, cos, sin, EPS, mode)
    torch.testing.assert_close(out, mod.reference(x, weight, cos, sin, EPS, mode), rtol=0, atol=0)


def test_op_fake_shapes():
    with FakeTensorMode():
        x = torch.empty(2, 7, 3, 64, dtype=torch.bfloat16)
        cos = torch.empty(7, 32)
        out = torch.ops.kopt.qk_norm_rope(x, torch.empty(64, dtype=torch.bfloat16), cos, cos, EPS, "complex")
        assert isinstance(out, FakeTensor)
        assert out.shape == x.shape and out.dtype == torch.bfloat16


def test_op_under_torch_compile_fullgraph():
    b, s, h, d = 1, 5, 2, 32
    g = torch.Generator().manual_seed(_seed("compile"))
    q = torch.randn(b, s, h, d, generator=g)
    k = torch.randn(b, s, h, d, generator=g)
    _, _, freqs = _tables(s, d, "complex", g)
    w = torch.randn(d, generator=g)

    def fn(q, k, freqs, w):
        cos, sin = freqs.real, freqs.imag
        q = torch.ops.kopt.qk_norm_rope(q, w, cos, sin, EPS, "complex")
        k = torch.ops.kopt.qk_norm_rope(k, None, cos, sin, EPS, "complex")
        return q.transpose(1, 2), k.transpose(1, 2)

    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    got_q, got_k = compiled(q, k, freqs, w)
    cos, sin = freqs.real, freqs.imag
    torch.testing.assert_close(got_q, mod.reference(q, w, cos, sin, EPS, "complex").transpose(1, 2))
    torch.testing.assert_close(got_k, mod.reference(k, None, cos, sin, EPS, "complex").transpose(1, 2))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    "shape,mode", [((1, 4352, 24, 128), "complex"), ((1, 4608, 48, 128), "real")], ids=["qwen-image", "flux2"]
)
def test_gpu_production_shape(shape, mode):
    x, weight, cos, sin = _inputs(*shape, torch.bfloat16, mode, _seed("gpu", mode), device="cuda")
    ref = mod.reference(x, weight, cos, sin, EPS, mode)
    out = torch.full_like(x, float("nan"))
    mod.launch(x, weight, cos, sin, EPS, mode, out=out)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < TOL[torch.bfloat16]
    op_out = torch.ops.kopt.qk_norm_rope(x, weight, cos, sin, EPS, mode)
    assert rel_err(op_out, ref) < TOL[torch.bfloat16]


@pytest.mark.gpu
@needs_cuda
def test_gpu_op_under_compile():
    x, weight, cos, sin = _inputs(1, 4352, 24, 128, torch.bfloat16, "complex", 91, device="cuda")
    fn = torch.compile(lambda x, w, c, s: torch.ops.kopt.qk_norm_rope(x, w, c, s, EPS, "complex"), fullgraph=True)
    ref = mod.reference(x, weight, cos, sin, EPS, "complex")
    assert rel_err(fn(x, weight, cos, sin), ref) < TOL[torch.bfloat16]
