"""Joint attention input: Qwen-Image's text + image Q/K norm+RoPE ops concatenated for attention
become one op writing both streams into the joint buffer; exact against the per-stream ops."""

from __future__ import annotations

import pytest
import torch

from kopt.fx.capture import trace_function
from kopt.passes.fuse.joint_attention_input import FuseJointAttentionInput
from kopt.passes.manager import run_passes
from tests.conftest import compile_close_to_eager

PIPELINE = ["redundancy", "sibling-merge", "bias-absorption", "fuse-qk-norm-rope", "fuse-joint-attention-input",
            "staging"]


@pytest.mark.parametrize("dtype, bound", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_fires_on_every_joint_q_and_k_of_tiny_qwen_image(dtype, bound):
    """2 dual-stream blocks × (Q, K) = 4 joint inputs; no per-stream op is left."""
    compiled = compile_close_to_eager("qwen-image", bound, seed=41, dtype=dtype, passes=PIPELINE)
    report = compiled.kopt_report
    assert report.matches("fuse-qk-norm-rope") == 8
    assert report.matches("fuse-joint-attention-input") == 4
    assert report.graphs[0].fallback is None


def _rope_inputs(s: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    angles = torch.rand(s, 4, generator=g) * 6.28
    return torch.randn(8, generator=g) * 0.2 + 1, angles.cos(), angles.sin()


def test_golden_cat_of_two_streams_is_exact():
    (w_t, c_t, s_t), (w_i, c_i, s_i) = _rope_inputs(3, 1), _rope_inputs(5, 2)
    op = torch.ops.kopt.qk_norm_rope.default

    def region(txt, img):
        return torch.cat([op(txt, w_t, c_t, s_t, 1e-6, "complex"), op(img, w_i, c_i, s_i, 1e-5, "complex")], dim=1)

    graph_module = trace_function(region, torch.randn(2, 3, 2, 8), torch.randn(2, 5, 2, 8))
    (record,) = run_passes(graph_module, [FuseJointAttentionInput()], strict=True)
    assert record.matches == {"joint-qk-norm-rope": 1}
    targets = {n.target for n in graph_module.graph.nodes}
    assert torch.ops.aten.cat.default not in targets and op not in targets
    txt, img = torch.randn(2, 3, 2, 8) * 2, torch.randn(2, 5, 2, 8) + 1
    torch.testing.assert_close(graph_module(txt, img), region(txt, img), rtol=0, atol=0)


def test_a_stream_read_elsewhere_is_a_near_miss():
    (w_t, c_t, s_t), (w_i, c_i, s_i) = _rope_inputs(3, 3), _rope_inputs(5, 4)
    op = torch.ops.kopt.qk_norm_rope.default

    def region(txt, img):
        t = op(txt, w_t, c_t, s_t, 1e-6, "complex")
        return torch.cat([t, op(img, w_i, c_i, s_i, 1e-6, "complex")], dim=1), t.sum()

    graph_module = trace_function(region, torch.randn(1, 3, 2, 8), torch.randn(1, 5, 2, 8))
    (record,) = run_passes(graph_module, [FuseJointAttentionInput()], strict=True)
    assert record.total_matches == 0
    assert [m.reason for m in record.near_misses] == [
        "a per-stream result has other users than the cat: the joint op would compute it twice"]


def test_unrelated_cats_are_not_near_misses():
    graph_module = trace_function(lambda a, b: torch.cat([a, b], dim=1) * 2, torch.randn(1, 3, 2, 8),
                                  torch.randn(1, 4, 2, 8))
    (record,) = run_passes(graph_module, [FuseJointAttentionInput()], strict=True)
    assert record.total_matches == 0 and record.near_misses == []
