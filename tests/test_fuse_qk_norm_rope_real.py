"""QK RMSNorm + real-form RoPE (FLUX.2): single streams and joint streams become one kopt op each,
whatever spelling the RMSNorm has, and the numbers match the unfused graph."""

from __future__ import annotations

import operator

import pytest
import torch
from diffusers.models.embeddings import apply_rotary_emb, get_1d_rotary_pos_embed

from kopt.fx.capture import trace_function
from kopt.fx.graph_utils import refresh_meta
from kopt.passes.fuse.qk_norm_rope_real import FuseQKNormRopeReal
from kopt.passes.manager import run_passes
from tests.conftest import compile_close_to_eager, rel_err, tiny_model_and_inputs

FUSED = ["redundancy", "sibling-merge", "bias-absorption", "fuse-qk-norm-rope-real", "staging"]
BOUND = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _tables(s: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.randperm(64, generator=torch.Generator().manual_seed(seed))[:s].double()
    cos, sin = get_1d_rotary_pos_embed(d, pos, theta=2000, use_real=True, repeat_interleave_real=True)
    return cos.float(), sin.float()


def _norm(d: int, dtype: torch.dtype, seed: int) -> torch.nn.RMSNorm:
    norm = torch.nn.RMSNorm(d, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(d, generator=torch.Generator().manual_seed(seed)) * 0.3 + 1)
    return norm


def _targets(graph_module: torch.fx.GraphModule) -> set:
    return {n.target for n in graph_module.graph.nodes}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fires_on_every_q_and_k_of_tiny_flux2(dtype):
    """1 double-stream block (joint text+image Q, K) and 1 single-stream block (Q, K)."""
    compiled = compile_close_to_eager("flux2", BOUND[dtype], seed=31, dtype=dtype, passes=FUSED)
    (record,) = compiled.kopt_report.pass_records("fuse-qk-norm-rope-real")
    assert record.matches == {"joint-qk-norm-rope-real": 2, "qk-norm-rope-real": 2}, record.near_misses
    assert compiled.kopt_report.graphs[0].fallback is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_golden_single_stream_becomes_one_op(dtype):
    norm = _norm(16, dtype, 1)
    cos, sin = _tables(7, 16, 2)

    def region(x):
        return apply_rotary_emb(norm(x), (cos, sin), sequence_dim=1)

    graph_module = trace_function(region, torch.randn(2, 7, 3, 16).to(dtype))
    (record,) = run_passes(graph_module, [FuseQKNormRopeReal()], strict=True)
    assert record.matches == {"qk-norm-rope-real": 1}, record.near_misses
    targets = _targets(graph_module)
    assert torch.ops.kopt.qk_norm_rope.default in targets
    assert not targets & {torch.ops.aten.unbind.int, torch.ops.aten.stack.default, torch.ops.aten.rsqrt.default}
    fresh = (torch.randn(2, 7, 3, 16) * 3 + 0.5).to(dtype)
    assert rel_err(graph_module(fresh), region(fresh)) < BOUND[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_golden_joint_streams_write_one_buffer(dtype):
    """Text and image Q normalized with their own weights, concatenated, rotated by one table."""
    norm_txt, norm_img = _norm(16, dtype, 3), _norm(16, dtype, 4)
    cos, sin = _tables(5 + 9, 16, 5)

    def region(txt, img):
        joint = torch.cat([norm_txt(txt), norm_img(img)], dim=1)
        return apply_rotary_emb(joint, (cos, sin), sequence_dim=1)

    txt, img = torch.randn(1, 5, 2, 16).to(dtype), torch.randn(1, 9, 2, 16).to(dtype)
    graph_module = trace_function(region, txt, img)
    (record,) = run_passes(graph_module, [FuseQKNormRopeReal()], strict=True)
    assert record.matches == {"joint-qk-norm-rope-real": 1}, record.near_misses
    targets = _targets(graph_module)
    assert torch.ops.kopt.qk_norm_rope_joint.default in targets and torch.ops.aten.cat.default not in targets
    fresh_txt, fresh_img = (torch.randn(1, 5, 2, 16) + 1).to(dtype), (torch.randn(1, 9, 2, 16) * 2).to(dtype)
    assert rel_err(graph_module(fresh_txt, fresh_img), region(fresh_txt, fresh_img)) < BOUND[dtype]


def _with_fused_rms_norm(graph_module: torch.fx.GraphModule, width: int) -> None:
    """Rewrite the decomposed RMSNorm (the CPU trace) into the CUDA trace's spelling,
    ``aten._fused_rms_norm(x, [D], weight, None)[0]``, which make_fx on the CPU does not keep."""
    graph = graph_module.graph
    (x,) = [n for n in graph.nodes if n.op == "placeholder"]
    (scaled,) = [n for n in graph.nodes if n.target is torch.ops.aten.mul.Tensor and n.args[1].op == "get_attr"]
    with graph.inserting_before(scaled):
        fused = graph.call_function(torch.ops.aten._fused_rms_norm.default, (x, [width], scaled.args[1], None))
        normed = graph.call_function(operator.getitem, (fused, 0))
    scaled.replace_all_uses_with(normed)
    graph.eliminate_dead_code()
    refresh_meta(graph_module)
    graph_module.recompile()


def test_fused_rms_norm_spelling_is_recognised():
    """The CUDA trace keeps torch.nn.RMSNorm as aten._fused_rms_norm(x, [D], w, eps)[0]; eps=None
    means finfo(dtype).eps, which the fused op must use too."""
    weight = torch.randn(16) * 0.2 + 1
    cos, sin = _tables(6, 16, 7)

    def region(x):
        normed = torch.nn.functional.rms_norm(x, [16], weight, None)
        return apply_rotary_emb(normed, (cos, sin), sequence_dim=1)

    graph_module = trace_function(region, torch.randn(2, 6, 3, 16))
    _with_fused_rms_norm(graph_module, 16)
    assert torch.ops.aten._fused_rms_norm.default in _targets(graph_module)
    (record,) = run_passes(graph_module, [FuseQKNormRopeReal()], strict=True)
    assert record.matches == {"qk-norm-rope-real": 1}, record.near_misses
    (fused,) = [n for n in graph_module.graph.nodes if n.target is torch.ops.kopt.qk_norm_rope.default]
    assert fused.args[4] == torch.finfo(torch.float32).eps
    fresh = torch.randn(2, 6, 3, 16) * 0.01  # small values: eps matters
    assert rel_err(graph_module(fresh), region(fresh)) < 1e-5


def test_bf16_tables_are_read_as_float32():
    norm = _norm(16, torch.bfloat16, 8)
    cos, sin = (t.bfloat16() for t in _tables(4, 16, 9))

    def region(x):
        return apply_rotary_emb(norm(x), (cos, sin), sequence_dim=1)

    graph_module = trace_function(region, torch.randn(1, 4, 2, 16).bfloat16())
    (record,) = run_passes(graph_module, [FuseQKNormRopeReal()], strict=True)
    assert record.total_matches == 1, record.near_misses
    fresh = torch.randn(1, 4, 2, 16).bfloat16()
    assert rel_err(graph_module(fresh), region(fresh)) < 2e-2


def test_a_different_rotation_is_a_near_miss_not_a_rewrite():
    """stack([a, -b]) is not the kernel's (-odd, even) rotation: declined, with the reason."""
    norm = _norm(16, torch.float32, 10)
    cos, sin = _tables(4, 16, 11)

    def region(x):
        n = norm(x)
        a, b = n.reshape(*n.shape[:-1], -1, 2).unbind(-1)
        rotated = torch.stack([b, -a], dim=-1).flatten(3)
        return n * cos[None, :, None] + rotated * sin[None, :, None]

    graph_module = trace_function(region, torch.randn(1, 4, 2, 16))
    (record,) = run_passes(graph_module, [FuseQKNormRopeReal()], strict=True)
    assert record.total_matches == 0
    assert [m.reason for m in record.near_misses] == [
        "the first stacked half is not negated: not the (-odd, even) rotation"]


def test_rope_without_a_norm_is_declined_with_the_reason():
    cos, sin = _tables(4, 16, 12)
    graph_module = trace_function(lambda x: apply_rotary_emb(x * 2, (cos, sin), sequence_dim=1),
                                  torch.randn(1, 4, 2, 16))
    (record,) = run_passes(graph_module, [FuseQKNormRopeReal()], strict=True)
    assert record.total_matches == 0 and len(record.near_misses) == 1
    assert "RMSNorm" in record.near_misses[0].reason


def test_heads_flattened_form_is_one_head_of_width_h_times_d():
    """LTX-Video's spelling: RMSNorm across all heads of (B, S, H*D), (1, S, H*D) tables, pairs from
    ``unflatten(2, (-1, 2))``. Fused as one head of width H*D; closer to the float32 reference than
    the bf16 graph it replaces, which rounds the norm's output before rotating it."""
    from diffusers.models.transformers.transformer_ltx import apply_rotary_emb as ltx_rotary

    width, s = 48, 7
    norm = _norm(width, torch.bfloat16, 13)
    cos, sin = (t[None] for t in _tables(s, width, 14))

    def region(x):
        return ltx_rotary(norm(x), (cos, sin))

    graph_module = trace_function(region, torch.randn(2, s, width).bfloat16())
    (record,) = run_passes(graph_module, [FuseQKNormRopeReal()], strict=True)
    assert record.matches == {"qk-norm-rope-real": 1}, record.near_misses
    assert not _targets(graph_module) & {torch.ops.aten.unbind.int, torch.ops.aten.stack.default}
    fresh = (torch.randn(2, s, width) * 2 + 0.3).bfloat16()
    norm32 = _norm(width, torch.float32, 13)
    exact = ltx_rotary(norm32(fresh.float()), (cos, sin))
    fused, unfused = graph_module(fresh), region(fresh)
    assert fused.shape == unfused.shape and fused.dtype == torch.bfloat16
    assert rel_err(fused.float(), exact) <= rel_err(unfused.float(), exact) * 1.05 + 1e-4
    assert rel_err(fused.float(), exact) < 1e-2


def test_fires_on_every_q_and_k_of_tiny_ltx_video():
    """Self-attention rotates Q and K; cross-attention normalizes them without RoPE (no match there)."""
    compiled = compile_close_to_eager("ltx-video", 2e-2, seed=15, dtype=torch.bfloat16,
                                      passes=["redundancy", "sibling-merge", "fuse-qk-norm-rope-real"])
    (record,) = compiled.kopt_report.pass_records("fuse-qk-norm-rope-real")
    blocks = len(tiny_model_and_inputs("ltx-video", seed=15)[1].transformer_blocks)
    assert record.matches == {"qk-norm-rope-real": 2 * blocks}, record.near_misses
