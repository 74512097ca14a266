"""kopt::qk_norm_rope_joint: per-stream kernels writing one joint buffer (interpreted on the CPU)
against the spec (each stream's reference, concatenated), for B = 1 and B > 1, and under FakeTensor."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kopt.kernels import joint_qk_norm_rope as mod
from tests.conftest import rel_err

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _streams(b, lengths, h, d, dtype, mode, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    xs, weights, cos, sin = [], [], [], []
    for i, s in enumerate(lengths):
        xs.append((torch.randn(b, s, h, d, generator=g) * 2 + 0.3).to(dtype).to(device))
        weights.append(None if i == 1 else (torch.randn(d, generator=g) * 0.2 + 1).to(dtype).to(device))
        width = d // 2 if mode == "complex" else d
        angles = torch.rand(s, width, generator=g) * 6.28
        cos.append(angles.cos().to(device))
        sin.append(angles.sin().to(device))
    return xs, weights, cos, sin, [1e-6 * (i + 1) for i in range(len(lengths))]


@pytest.mark.parametrize("b", [1, 2])
@pytest.mark.parametrize("mode", ["complex", "real"])
def test_launcher_matches_the_concatenated_references(b, mode):
    xs, weights, cos, sin, eps = _streams(b, [3, 5, 2], 3, 8, torch.float32, mode, seed=b * 7 + len(mode))
    out = torch.full((b, 10, 3, 8), float("nan"))
    mod.launch(xs, weights, cos, sin, eps, mode, out=out)
    assert not torch.isnan(out).any()
    assert rel_err(out, mod.reference(xs, weights, cos, sin, eps, mode)) < 1e-5


def test_bf16_stream_within_one_rounding():
    xs, weights, cos, sin, eps = _streams(1, [4, 6], 2, 16, torch.bfloat16, "real", seed=3)
    got = mod.launch(xs, weights, cos, sin, eps, "real")
    assert rel_err(got, mod.reference(xs, weights, cos, sin, eps, "real")) < 1e-2


def test_mismatched_streams_are_refused_clearly():
    xs, weights, cos, sin, eps = _streams(1, [3, 5], 2, 8, torch.float32, "complex", seed=4)
    with pytest.raises(ValueError, match="B, H and D must agree"):
        mod.launch([xs[0], xs[1][:, :, :1]], weights, cos, sin, eps, "complex")
    with pytest.raises(ValueError, match="one entry per segment"):
        mod.launch(xs, weights[:1], cos, sin, eps, "complex")


def test_fake_implementation_gives_the_joint_shape():
    xs, weights, cos, sin, eps = _streams(2, [3, 5], 2, 8, torch.float32, "complex", seed=5)
    with FakeTensorMode() as fake_mode:
        fakes = [fake_mode.from_tensor(t) for t in xs]
        out = torch.ops.kopt.qk_norm_rope_joint(fakes, [fake_mode.from_tensor(w) if w is not None else None
                                                        for w in weights],
                                                [fake_mode.from_tensor(c) for c in cos],
                                                [fake_mode.from_tensor(s) for s in sin], eps, "complex")
    assert tuple(out.shape) == (2, 8, 2, 8) and out.dtype == torch.float32


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("lengths,h,mode", [([256, 4096], 24, "complex"), ([512, 4096], 48, "real")],
                         ids=["qwen-image", "flux2"])
def test_gpu_production_shape(lengths, h, mode):
    xs, weights, cos, sin, eps = _streams(1, lengths, h, 128, torch.bfloat16, mode, seed=6, device="cuda")
    ref = mod.reference(xs, weights, cos, sin, eps, mode)
    assert rel_err(torch.ops.kopt.qk_norm_rope_joint(xs, weights, cos, sin, eps, mode), ref) < 1e-2
