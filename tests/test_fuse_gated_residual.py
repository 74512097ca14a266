"""Gated-residual fusion: r + gate * y feeding an adaLN becomes one kopt op with two outputs."""

from __future__ import annotations

import torch

import kopt
from kopt.fx.capture import trace_function
from kopt.passes.fuse.adaln import FuseAdaLN
from kopt.passes.fuse.gated_residual import FuseGatedResidual
from kopt.passes.manager import run_passes
from tests.conftest import rel_err

PIPELINE = ["redundancy", "sibling-merge", "bias-absorption", "fuse-adaln", "fuse-gated-residual", "staging"]
EXPECTED = {"qwen-image": 6, "flux2": 2}  # every block boundary where the next adaLN reads r + gate * y


def test_fires_on_tiny_dits_and_matches_eager(tiny_dit):
    workload, model, inputs = tiny_dit
    compiled = kopt.compile(model, passes=PIPELINE, lower="eager", verify=True)
    with torch.no_grad():
        assert rel_err(compiled(**inputs)[0], model(**inputs)[0]) < 1e-5
    record = compiled.kopt_report.pass_records("fuse-gated-residual")[0]
    assert record.matches == {"gated-residual": EXPECTED[workload.name]}
    assert compiled.kopt_report.graphs[0].fallback is None


def _block_boundary(r, y, gate, scale, shift):
    r_new = r + gate[:, None] * y
    m = torch.nn.functional.layer_norm(r_new, (r.shape[-1],), eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
    return r_new * 2, m  # the new residual has another reader


def test_golden_one_op_feeds_both_readers():
    args = [torch.randn(2, 5, 24), torch.randn(2, 5, 24), torch.randn(2, 24), torch.randn(2, 24), torch.randn(2, 24)]
    graph_module = trace_function(_block_boundary, *args)
    records = run_passes(graph_module, [FuseAdaLN(), FuseGatedResidual()], strict=True)
    assert records[1].matches == {"gated-residual": 1}
    ops = [n.target for n in graph_module.graph.nodes if n.op == "call_function"]
    assert torch.ops.kopt.gated_residual.default in ops
    assert torch.ops.kopt.adaln_modulation.default not in ops and torch.ops.aten.add.Tensor not in ops
    fresh = [torch.randn_like(a) for a in args]
    for got, want in zip(graph_module(*fresh), _block_boundary(*fresh), strict=True):
        assert rel_err(got, want) < 1e-6


def _chain_of_blocks(r, ys, gates, scale, shift):
    """Four block boundaries in a row, each residual the previous boundary's new residual."""
    outs = []
    for i in range(4):
        r = r + gates[:, i, None] * ys[i]
        outs.append(torch.nn.functional.layer_norm(r, (r.shape[-1],), eps=1e-6) * (1 + scale[:, None]) + shift[:, None])
    return r, *outs


def test_every_boundary_of_a_chain_fuses():
    """A rewritten boundary's residual output feeds the next boundary: the fused op's outputs carry
    shapes, so the next match sees them (it used to miss every other boundary: 2 of 4)."""
    args = [torch.randn(2, 5, 24), torch.randn(4, 2, 5, 24), torch.randn(2, 4, 24), torch.randn(2, 24),
            torch.randn(2, 24)]
    graph_module = trace_function(_chain_of_blocks, *args)
    records = run_passes(graph_module, [FuseAdaLN(), FuseGatedResidual()], strict=True)
    assert records[1].matches == {"gated-residual": 4}
    ops = [n.target for n in graph_module.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.add.Tensor not in ops and torch.ops.kopt.adaln_modulation.default not in ops
    fresh = [torch.randn_like(a) for a in args]
    for got, want in zip(graph_module(*fresh), _chain_of_blocks(*fresh), strict=True):
        assert rel_err(got, want) < 1e-5


def _rms_boundary(r, y, gate, scale, shift):
    r_new = r + gate[:, None] * y
    normed = r_new * torch.rsqrt(r_new.pow(2).mean(-1, keepdim=True) + 1e-6)  # RMSNorm as DiTs spell it
    return r_new * 2, normed * (1 + scale[:, None]) + shift[:, None]


def test_a_reader_before_the_modulation_inputs_still_fuses():
    """r_new read before scale[:, None] is computed: the scale and shift views move up with the fused
    op (they do not depend on r_new), so every reader comes after it."""
    def early_reader(r, y, gate, scale, shift):
        r_new = r + gate[:, None] * y
        doubled = r_new * 2
        normed = r_new * torch.rsqrt(r_new.pow(2).mean(-1, keepdim=True) + 1e-6)
        return doubled, normed * (1 + scale[:, None]) + shift[:, None]

    args = [torch.randn(2, 5, 24), torch.randn(2, 5, 24), torch.randn(2, 24), torch.randn(2, 24), torch.randn(2, 24)]
    graph_module = trace_function(early_reader, *args)
    records = run_passes(graph_module, [FuseAdaLN(), FuseGatedResidual()], strict=True)
    assert records[1].matches == {"gated-residual": 1}, records[1].near_misses
    fresh = [torch.randn(2, 5, 24) for _ in range(2)] + [torch.randn(2, 24) for _ in range(3)]
    for got, exact in zip(graph_module(*fresh), early_reader(*(t.double() for t in fresh)), strict=True):
        assert rel_err(got, exact) < 1e-5


def test_a_scale_computed_from_the_residual_is_declined():
    def self_modulated(r, y, gate, shift):
        r_new = r + gate[:, None] * y
        scale = r_new.mean(1)  # depends on r_new: the fused op cannot compute it first
        normed = torch.nn.functional.layer_norm(r_new, (24,), eps=1e-6)
        return normed * (1 + scale[:, None]) + shift[:, None]

    args = [torch.randn(2, 5, 24), torch.randn(2, 5, 24), torch.randn(2, 24), torch.randn(2, 24)]
    graph_module = trace_function(self_modulated, *args)
    records = run_passes(graph_module, [FuseAdaLN(), FuseGatedResidual()], strict=False)
    assert records[1].total_matches == 0


def test_rms_norm_boundary_fuses_with_the_rms_flag():
    """LTX-Video's seam: r + gate * y read by an RMSNorm without weight, then modulated; checked against
    float64 on fresh inputs."""
    args = [torch.randn(2, 5, 24), torch.randn(2, 5, 24), torch.randn(2, 24), torch.randn(2, 24), torch.randn(2, 24)]
    graph_module = trace_function(_rms_boundary, *args)
    records = run_passes(graph_module, [FuseAdaLN(), FuseGatedResidual()], strict=True)
    assert records[1].matches == {"gated-residual": 1}, records[1].near_misses
    (fused,) = [n for n in graph_module.graph.nodes if n.target is torch.ops.kopt.gated_residual.default]
    assert fused.args[6] is True
    fresh = [torch.randn(2, 5, 24) * 2, torch.randn(2, 5, 24), torch.randn(2, 24), torch.randn(2, 24) * 0.3,
             torch.randn(2, 24)]
    want = _rms_boundary(*(t.double() for t in fresh))
    for got, exact in zip(graph_module(*fresh), want, strict=True):
        assert rel_err(got, exact) < 1e-5


def test_every_block_boundary_of_tiny_ltx_video_fuses():
    """Each block's feed-forward residual feeds the next block's RMSNorm; the last one feeds the output
    LayerNorm: one fused seam per block."""
    from tests.conftest import tiny_model_and_inputs

    _, model, inputs = tiny_model_and_inputs("ltx-video", seed=5)
    compiled = kopt.compile(model, passes=PIPELINE, lower="eager", verify=True)
    with torch.no_grad():
        assert rel_err(compiled(**inputs)[0], model(**inputs)[0]) < 1e-5
    record = compiled.kopt_report.pass_records("fuse-gated-residual")[0]
    assert record.matches == {"gated-residual": len(model.transformer_blocks)}, record.near_misses
