"""Sibling-projection merge: fires on Q/K/V and modulation GEMMs, numbers match, any sibling count."""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis import given, settings

import kopt
from kopt.fx.capture import trace_function
from kopt.passes.graph.redundancy import RedundancyElimination
from kopt.passes.graph.sibling_merge import SiblingProjectionMerge
from kopt.passes.manager import run_passes
from tests.conftest import rel_err

aten = torch.ops.aten
# Per model: image and text Q/K/V per double block, plus one group of modulation GEMMs that all
# read the timestep embedding (Qwen-Image: img_mod and txt_mod of every block; FLUX.2: the shared
# double/single-stream modulation layers).
EXPECTED_MERGES = {"qwen-image": 2 * 2 + 1, "flux2": 1 * 2 + 1}


def test_fires_on_tiny_dits_with_expected_counts(tiny_dit):
    workload, model, inputs = tiny_dit
    compiled = kopt.compile(model, passes=["redundancy", "sibling-merge"], lower="eager", verify=True)
    with torch.no_grad():
        reference = model(**inputs)[0]
        assert rel_err(compiled(**inputs)[0], reference) < 1e-5
        fresh = workload.inputs("tiny", seed=7)
        assert rel_err(compiled(**fresh)[0], model(**fresh)[0]) < 1e-5
    (_, record) = compiled.kopt_report.graphs[0].passes
    assert record.matches == {"merge-siblings": EXPECTED_MERGES[workload.name]}
    assert record.after["gemm"] < record.before["gemm"]
    assert compiled.kopt_report.graphs[0].fallback is None


def test_golden_graph_one_gemm_then_split():
    """Three projections of x (two with bias, one without) become addmm + split_with_sizes."""
    wq, wk, wv = torch.randn(6, 8), torch.randn(4, 8), torch.randn(5, 8)
    bq, bv = torch.randn(6), torch.randn(5)

    def qkv(x):
        return x @ wq.T + bq, x @ wk.T, torch.nn.functional.linear(x, wv, bv)

    graph_module = trace_function(qkv, torch.randn(3, 8))
    run_passes(graph_module, [RedundancyElimination(), SiblingProjectionMerge()], strict=True)
    ops = [n.target for n in graph_module.graph.nodes if n.op == "call_function"]
    assert ops.count(aten.addmm.default) == 1 and aten.mm.default not in ops
    (split,) = [n for n in graph_module.graph.nodes if n.target is aten.split_with_sizes.default]
    assert split.args[1] == [6, 4, 5]
    x = torch.randn(3, 8)
    for got, want in zip(graph_module(x), qkv(x), strict=True):
        assert rel_err(got, want) < 1e-6


def test_activation_products_are_near_misses():
    """x @ x.T shares x with a linear, but its weight is no constant: declined with a reason."""
    w = torch.randn(8, 8)

    def fn(x):
        return x @ w.T, x @ x.T

    graph_module = trace_function(fn, torch.randn(8, 8))
    records = run_passes(graph_module, [SiblingProjectionMerge()], strict=True)
    assert records[0].total_matches == 0
    assert any("not a constant" in m.reason for m in records[0].near_misses)


@settings(max_examples=25, deadline=None)
@given(siblings=st.integers(2, 5), rows=st.integers(1, 9), features=st.integers(1, 12),
       outs=st.lists(st.integers(1, 10), min_size=5, max_size=5), bias=st.lists(st.booleans(), min_size=5, max_size=5),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]), seed=st.integers(0, 2**16))
def test_property_any_number_of_siblings(siblings, rows, features, outs, bias, dtype, seed):
    """For any count, width and bias mix, merged outputs equal the separate linears (dtype-aware)."""
    generator = torch.Generator().manual_seed(seed)
    weights = [torch.randn(outs[i], features, generator=generator).to(dtype) for i in range(siblings)]
    biases = [torch.randn(outs[i], generator=generator).to(dtype) if bias[i] else None for i in range(siblings)]

    def fn(x):
        return tuple(torch.nn.functional.linear(x, w, b) for w, b in zip(weights, biases, strict=True))

    x = torch.randn(rows, features, generator=generator).to(dtype)
    graph_module = trace_function(fn, x)
    records = run_passes(graph_module, [RedundancyElimination(), SiblingProjectionMerge()], strict=True)
    assert records[1].matches == {"merge-siblings": 1}
    bound = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    for got, want in zip(graph_module(x), fn(x), strict=True):
        assert got.shape == want.shape and rel_err(got, want) <= bound


def test_views_and_casts_between_do_not_hide_siblings():
    """Each projection reads its own cast and reshape of x: after redundancy they are one value."""
    wq, wk = torch.randn(6, 8, dtype=torch.float64), torch.randn(6, 8, dtype=torch.float64)

    def fn(x):
        q = torch.nn.functional.linear(x.to(torch.float64).reshape(-1, 8), wq)
        k = torch.nn.functional.linear(x.to(torch.float64).reshape(-1, 8), wk)
        return q.view(2, 3, 6), k.view(2, 3, 6)

    graph_module = trace_function(fn, torch.randn(2, 3, 8))
    records = run_passes(graph_module, [RedundancyElimination(), SiblingProjectionMerge()], strict=True)
    assert records[1].matches == {"merge-siblings": 1}
    x = torch.randn(2, 3, 8)
    for got, want in zip(graph_module(x), fn(x), strict=True):
        assert rel_err(got, want) < 1e-12
