"""Bias absorption: the bias leaves the GEMM only when an elementwise region follows it."""

from __future__ import annotations

import torch

import kopt
from kopt.fx.capture import trace_function
from kopt.passes.graph.bias_absorption import BiasAbsorption
from kopt.passes.manager import run_passes
from kopt.workloads import get_workload
from tests.conftest import rel_err

aten = torch.ops.aten
W, B = torch.randn(12, 8), torch.randn(12)


def _gated_residual(x, gate, residual):
    return residual + gate * torch.nn.functional.linear(x, W, B)


def test_golden_bias_moves_next_to_the_gate():
    """addmm(b, x, W.T) becomes mm(x, W.T) + b feeding the gate multiply."""
    graph_module = trace_function(_gated_residual, torch.randn(2, 5, 8), torch.randn(12), torch.randn(2, 5, 12))
    (record,) = run_passes(graph_module, [BiasAbsorption()], strict=True)
    assert record.matches == {"bias-into-epilogue": 1}
    ops = [n.target for n in graph_module.graph.nodes if n.op == "call_function"]
    assert aten.addmm.default not in ops and aten.mm.default in ops
    (mm,) = [n for n in graph_module.graph.nodes if n.target is aten.mm.default]
    (add,) = mm.users
    assert add.target is aten.add.Tensor and add.args[1].op == "get_attr"
    args = torch.randn(2, 5, 8), torch.randn(12), torch.randn(2, 5, 12)
    assert rel_err(graph_module(*args), _gated_residual(*args)) < 1e-6


def test_declines_before_a_gemm_or_the_output():
    """Followed by another GEMM (or returned directly), the bias stays in the epilogue; reasons given."""
    w2, b2 = torch.randn(4, 12), torch.randn(4)

    def two_linears(x):
        return torch.nn.functional.linear(torch.nn.functional.linear(x, W, B), w2, b2)

    graph_module = trace_function(two_linears, torch.randn(3, 8))
    (record,) = run_passes(graph_module, [BiasAbsorption()], strict=True)
    assert record.total_matches == 0
    reasons = sorted(m.reason for m in record.near_misses)
    assert any("not an elementwise region" in r for r in reasons)
    assert any("graph output" in r for r in reasons)


def test_on_tiny_qwen_image():
    """Qwen-Image's output projections and MLP layers lose their bias adds; numbers stay put."""
    workload = get_workload("qwen-image")
    torch.manual_seed(0)
    model = workload.model("tiny")
    inputs = workload.inputs("tiny", seed=17)
    compiled = kopt.compile(model, passes=["redundancy", "sibling-merge", "bias-absorption"], lower="eager",
                            verify=True)
    with torch.no_grad():
        assert rel_err(compiled(**inputs)[0], model(**inputs)[0]) < 1e-5
    record = compiled.kopt_report.pass_records("bias-absorption")[0]
    assert record.matches == {"bias-into-epilogue": 13}
    # the merged Q/K/V and modulation GEMMs are followed by a split: declined with that reason
    assert sum("split_with_sizes" in m.reason for m in record.near_misses) == 5
