"""kopt::qk_norm_rope_pair: Q and K in one kernel (interpreted on CPU) against two single
qk_norm_rope references, with their own weights and eps, strided inputs, every launch config, and
the op under FakeTensor / torch.compile."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kopt.kernels import qk_norm_rope as single
from kopt.kernels import qk_norm_rope_pair as mod
from tests.conftest import rel_err
from tests.kernels.test_qk_norm_rope import TOL, _inputs, _seed

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _pair(b, s, h, d, dtype, mode, seed, device="cpu"):
    """Q and K with their own weights, one pair of tables (K's own tables are dropped)."""
    q, wq, cos, sin = _inputs(b, s, h, d, dtype, mode, seed, device)
    k, wk, _, _ = _inputs(b, s, h, d, dtype, mode, seed + 1, device)
    return q, wq, k, wk * 0.5, cos, sin


@pytest.mark.parametrize("mode", ["complex", "real"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,s,h,d", [(2, 5, 2, 64), (1, 7, 3, 48), (1, 4, 1, 512)])  # last: heads flattened
def test_pair_matches_two_single_references(b, s, h, d, dtype, mode):
    q, wq, k, wk, cos, sin = _pair(b, s, h, d, dtype, mode, _seed("pair", b, s, h, d, dtype, mode))
    out_q, out_k = single.launch_pair(q, wq, 1e-6, k, wk, 1e-5, cos, sin, mode)
    assert out_q.shape == q.shape and out_k.shape == k.shape and out_q.dtype == out_k.dtype == dtype
    assert rel_err(out_q, single.reference(q, wq, cos, sin, 1e-6, mode)) < TOL[dtype]
    assert rel_err(out_k, single.reference(k, wk, cos, sin, 1e-5, mode)) < TOL[dtype]
    # the two outputs are not the same computation: K's weight and values differ from Q's
    assert rel_err(out_k, single.reference(k, wq, cos, sin, 1e-5, mode)) > 10 * TOL[dtype]


@pytest.mark.parametrize("mode", ["complex", "real"])
def test_every_candidate_and_one_weight_missing(mode):
    b, s, h, d = 2, 5, 6, 64
    q, wq, k, _, cos, sin = _pair(b, s, h, d, torch.float32, mode, _seed("pair-configs", mode))
    want_q = single.reference(q, wq, cos, sin, 1e-6, mode)
    want_k = single.reference(k, None, cos, sin, 1e-6, mode)
    for config in single.candidates(d // 2, b * s * h):
        out_q, out_k = single.launch_pair(q, wq, 1e-6, k, None, 1e-6, cos, sin, mode, config=config)
        assert rel_err(out_q, want_q) < TOL[torch.float32], config
        assert rel_err(out_k, want_k) < TOL[torch.float32], config


def test_strided_q_and_k_from_one_fused_projection():
    """Q and K as views into one (B, S, 3*H*D) projection: each read through its own strides."""
    b, s, h, d = 2, 5, 2, 32
    g = torch.Generator().manual_seed(_seed("pair-qkv"))
    qkv = torch.randn(b, s, 3 * h * d, generator=g)
    q, k = (qkv[..., i * h * d:(i + 1) * h * d].unflatten(-1, (h, d)) for i in (0, 1))
    _, _, cos, sin = _inputs(b, s, h, d, torch.float32, "real", 3)
    out_q, out_k = single.launch_pair(q, None, 1e-6, k, None, 1e-6, cos, sin, "real")
    assert rel_err(out_q, single.reference(q, None, cos, sin, 1e-6, "real")) < TOL[torch.float32]
    assert rel_err(out_k, single.reference(k, None, cos, sin, 1e-6, "real")) < TOL[torch.float32]


def test_poisoned_outputs_are_fully_written():
    q, wq, k, wk, cos, sin = _pair(1, 5, 3, 32, torch.float32, "real", 11)
    out_q, out_k = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    single.launch_pair(q, wq, 1e-6, k, wk, 1e-6, cos, sin, "real", out_q, out_k)
    assert torch.isfinite(out_q).all() and torch.isfinite(out_k).all()
    assert rel_err(out_k, single.reference(k, wk, cos, sin, 1e-6, "real")) < TOL[torch.float32]


def test_pair_validates_inputs():
    q, wq, k, wk, cos, sin = _pair(1, 5, 2, 32, torch.float32, "real", 5)
    with pytest.raises(ValueError, match="a pair must agree"):
        single.launch_pair(q, wq, 1e-6, k[:, :4], wk, 1e-6, cos, sin, "real")
    with pytest.raises(ValueError, match="weight of x2"):
        single.launch_pair(q, wq, 1e-6, k, wk[:16], 1e-6, cos, sin, "real")


def test_op_on_cpu_and_fake_and_compiled():
    q, wq, k, wk, cos, sin = _pair(1, 5, 2, 32, torch.float32, "complex", 7)
    out_q, out_k = torch.ops.kopt.qk_norm_rope_pair(q, wq, 1e-6, k, wk, 1e-6, cos, sin, "complex")
    assert rel_err(out_q, single.reference(q, wq, cos, sin, 1e-6, "complex")) < 1e-6
    assert rel_err(out_k, single.reference(k, wk, cos, sin, 1e-6, "complex")) < 1e-6
    with FakeTensorMode() as fake_mode:
        fq, fk = (fake_mode.from_tensor(t) for t in (q, k))
        a, b = torch.ops.kopt.qk_norm_rope_pair(fq, None, 1e-6, fk, None, 1e-6, fake_mode.from_tensor(cos),
                                                fake_mode.from_tensor(sin), "complex")
        assert a.shape == q.shape and b.shape == k.shape

    def fn(q, k):
        a, b = torch.ops.kopt.qk_norm_rope_pair(q, wq, 1e-6, k, wk, 1e-6, cos, sin, "complex")
        return a + b

    got = torch.compile(fn, backend="aot_eager", fullgraph=True)(q, k)
    assert rel_err(got, out_q + out_k) < 1e-6


def test_reference_is_two_single_references():
    q, wq, k, wk, cos, sin = _pair(1, 3, 2, 16, torch.float32, "real", 9)
    a, b = mod.reference(q, wq, 1e-6, k, wk, 1e-5, cos, sin, "real")
    assert torch.equal(a, single.reference(q, wq, cos, sin, 1e-6, "real"))
    assert torch.equal(b, single.reference(k, wk, cos, sin, 1e-5, "real"))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mode,shape", [("real", (1, 6930, 1, 2048)), ("real", (1, 4608, 24, 128)),
                                        ("complex", (1, 4352, 24, 128))])
def test_gpu_production_shapes(mode, shape):
    q, wq, k, wk, cos, sin = _pair(*shape, torch.bfloat16, mode, 21, device="cuda")
    out_q, out_k = single.launch_pair(q, wq, 1e-6, k, wk, 1e-6, cos, sin, mode)
    assert rel_err(out_q, single.reference(q, wq, cos, sin, 1e-6, mode)) < TOL[torch.bfloat16]
    assert rel_err(out_k, single.reference(k, wk, cos, sin, 1e-6, mode)) < TOL[torch.bfloat16]
