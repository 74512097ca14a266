"""QK RMSNorm + complex RoPE fusion: fires on Qwen-Image's Q and K (fp32 and bf16), casts do not hide it."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.normalization import RMSNorm
from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

import kopt
from kopt.fx.capture import trace_function
from kopt.passes.fuse.qk_norm_rope import FuseQKNormRope
from kopt.passes.manager import run_passes
from kopt.workloads import get_workload
from tests.conftest import compile_close_to_eager, rel_err

PIPELINE = ["redundancy", "sibling-merge", "bias-absorption", "fuse-qk-norm-rope", "staging"]


@pytest.mark.parametrize("dtype, bound", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_fires_on_every_q_and_k_of_tiny_qwen_image(dtype, bound):
    """2 blocks × (image, text) × (Q, K) = 8 regions; the output stays within the dtype's bound."""
    compiled = compile_close_to_eager("qwen-image", bound, seed=21, dtype=dtype, passes=PIPELINE)
    assert compiled.kopt_report.matches("fuse-qk-norm-rope") == 8
    assert compiled.kopt_report.graphs[0].fallback is None


def test_flux2_real_rope_is_not_mistaken_for_the_complex_form():
    workload = get_workload("flux2")
    model = workload.model("tiny")
    compiled = kopt.compile(model, passes=["redundancy", "fuse-qk-norm-rope"], lower="eager")
    with torch.no_grad():
        compiled(**workload.inputs("tiny", seed=2))
    assert compiled.kopt_report.matches("fuse-qk-norm-rope") == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_golden_diffusers_norm_and_rope_become_one_op(dtype):
    """diffusers' RMSNorm + apply_rotary_emb_qwen, traced: one kopt op remains, no complex ops."""
    norm = RMSNorm(16, eps=1e-6).to(dtype)
    torch.nn.init.normal_(norm.weight)
    angles = torch.rand(5, 8) * 6.28
    freqs = torch.polar(torch.ones_like(angles), angles)

    def region(x):
        return apply_rotary_emb_qwen(norm(x), freqs, use_real=False)

    x = torch.randn(2, 5, 3, 16).to(dtype)
    graph_module = trace_function(region, x)
    (record,) = run_passes(graph_module, [FuseQKNormRope()], strict=True)
    assert record.matches == {"qk-norm-rope": 1}, record.near_misses
    targets = {n.target for n in graph_module.graph.nodes}
    assert torch.ops.kopt.qk_norm_rope.default in targets and torch.ops.aten.view_as_complex.default not in targets
    fresh = torch.randn(2, 5, 3, 16).to(dtype)
    assert rel_err(graph_module(fresh), region(fresh)) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_norm_without_rope_is_left_alone():
    norm = RMSNorm(16, eps=1e-6)
    graph_module = trace_function(lambda x: norm(x) * 2, torch.randn(2, 5, 3, 16))
    (record,) = run_passes(graph_module, [FuseQKNormRope()], strict=True)
    assert record.total_matches == 0 and record.near_misses == []


def test_all_kernel_fusions_survive_inductor_on_qwen_image():
    """The kopt ops (the joint one takes lists of tensors) and the complex table views feeding them
    lower through Inductor."""
    workload = get_workload("qwen-image")
    torch.manual_seed(0)
    model = workload.model("tiny")
    passes = ["redundancy", "sibling-merge", "bias-absorption", "fuse-adaln", "fuse-gated-residual",
              "fuse-qk-norm-rope", "fuse-joint-attention-input", "staging"]
    compiled = kopt.compile(model, passes=passes)
    inputs = workload.inputs("tiny", seed=6)
    with torch.no_grad():
        assert rel_err(compiled(**inputs)[0], model(**inputs)[0]) < 1e-5
    report = compiled.kopt_report
    assert report.graphs[0].lowering == "inductor" and report.graphs[0].fallback is None
    assert (report.matches("fuse-adaln"), report.matches("fuse-gated-residual"),
            report.matches("fuse-qk-norm-rope"), report.matches("fuse-joint-attention-input")) == (8, 6, 8, 4)
