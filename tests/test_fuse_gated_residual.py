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
