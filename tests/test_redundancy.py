"""Redundant-work elimination: fires on real models, exact numbers, golden graph, property test."""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis import given, settings

import kopt
from kopt.fx.capture import trace_function
from kopt.passes.base import PassContext
from kopt.passes.graph.redundancy import RedundancyElimination
from kopt.passes.manager import run_passes


def test_fires_on_tiny_dits_and_stays_bit_identical(tiny_dit):
    """CSE and identity removal fire on both real models; output unchanged bit for bit."""
    workload, model, inputs = tiny_dit
    compiled = kopt.compile(model, passes=["redundancy"], lower="eager", verify=True)
    with torch.no_grad():
        assert torch.equal(compiled(**inputs)[0], model(**inputs)[0])
        fresh = workload.inputs("tiny", seed=99)
        assert torch.equal(compiled(**fresh)[0], model(**fresh)[0])
    (record,) = compiled.kopt_report.graphs[0].passes
    assert record.matches["cse"] >= 20
    assert compiled.kopt_report.graphs[0].fallback is None


def _repeated_work(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    a = (x.to(torch.float32) @ w).view(x.shape[0], -1)
    b = (x.to(torch.float32) @ w).view(x.shape[0], -1)  # the same product again
    c = torch.cat([a, b]) + torch.cat([a, b])  # the same concatenation again
    return c.reshape(c.shape) * 2  # an identity reshape


def test_golden_graph_after_elimination():
    """Each value is computed once and the identity reshape is gone."""
    graph_module = trace_function(_repeated_work, torch.randn(3, 4), torch.randn(4, 5))
    ctx = PassContext("redundancy")
    RedundancyElimination().apply(graph_module, ctx)
    graph_module.recompile()
    ops = [str(n.target) for n in graph_module.graph.nodes if n.op == "call_function"]
    assert ops == ["aten.mm.default", "aten.cat.default", "aten.add.Tensor", "aten.mul.Tensor"], ops
    # second mm and second cat are merged; both (3, 5) views and the reshape are identities
    assert ctx.matches == {"cse": 2, "identity-view-or-cast": 3}
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    assert torch.equal(graph_module(x, w), _repeated_work(x, w))


def test_random_ops_are_never_merged():
    """Two dropout-like random draws stay two draws."""
    def two_draws(x):
        return torch.rand_like(x) + torch.rand_like(x)

    graph_module = trace_function(two_draws, torch.randn(8))
    RedundancyElimination().apply(graph_module, PassContext("redundancy"))
    draws = [n for n in graph_module.graph.nodes if "rand" in str(n.target)]
    assert len(draws) == 2


_UNARY = [torch.sin, torch.exp, torch.tanh, lambda t: t * 3.0, lambda t: t.to(torch.float64).to(t.dtype),
          lambda t: t.reshape(t.shape), lambda t: t.view(-1).view(t.shape)]


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
       program=st.lists(st.tuples(st.integers(0, len(_UNARY) - 1), st.integers(0, 7)), min_size=1, max_size=12),
       seed=st.integers(0, 2**16))
def test_property_random_programs_unchanged(shape, dtype, program, seed):
    """On random programs with repeated subexpressions the pass keeps outputs bit-identical."""
    def fn(x):
        values = [x]
        for op, source in program:
            values.append(_UNARY[op](values[source % len(values)]))
        return tuple(values[1:])

    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
    graph_module = trace_function(fn, x)
    records = run_passes(graph_module, [RedundancyElimination()], strict=True)
    outputs, reference = graph_module(x), fn(x)
    for a, b in zip(outputs, reference, strict=True):  # bit-identical; NaN where the program makes one (sin(inf))
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    assert records[0].after["nodes"] <= records[0].before["nodes"]
