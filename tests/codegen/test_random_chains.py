"""Property: for random elementwise chains (with an optional row reduction) on random shapes, every
region codegen finds runs in Triton like its reference, and the rewritten graph like the original."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kopt.codegen import compile_region, find_regions
from kopt.fx.capture import trace_function
from kopt.passes.fuse.codegen import CodegenFuse
from kopt.passes.manager import run_passes
from tests.codegen.conftest import node_values
from tests.conftest import rel_err

BINARY = [
    lambda a, b: a + b,
    lambda a, b: a * b,
    lambda a, b: a - 0.5 * b,
    lambda a, b: torch.maximum(a, b),
    lambda a, b: torch.where(a > b, a, b * 0.25),
]
UNARY = [
    torch.tanh,
    lambda a: torch.sigmoid(a) * 2,
    lambda a: torch.exp(a.clamp(-3, 3)),
    lambda a: a.abs().sqrt() + 0.1,
    torch.nn.functional.silu,
    torch.nn.functional.gelu,
]
REDUCE = [
    lambda a: a.mean(-1, keepdim=True),
    lambda a: a.amax(-1, keepdim=True),
    lambda a: torch.rsqrt(a.pow(2).sum(-1, keepdim=True) + 1.0),
]

chains = st.lists(st.tuples(st.booleans(), st.integers(0, 5)), min_size=2, max_size=6)


def _build(chain, reduce_with):
    def fn(x, y):
        value = x
        for binary, which in chain:
            value = BINARY[which % len(BINARY)](value, y) if binary else UNARY[which](value)
        if reduce_with is not None:
            value = value * REDUCE[reduce_with](value) + y
        return value

    return fn


@settings(max_examples=12, deadline=None)
@given(chain=chains, reduce_with=st.one_of(st.none(), st.integers(0, 2)),
       rows=st.sampled_from([1, 5]), n=st.sampled_from([1, 3, 37]), y_shape=st.sampled_from(["full", "row", "vec"]),
       seed=st.integers(0, 2**16))
def test_random_chain(chain, reduce_with, rows, n, y_shape, seed):
    g = torch.Generator().manual_seed(seed)
    shape = {"full": (rows, n), "row": (rows, 1), "vec": (n,)}[y_shape]
    x, y = torch.randn(rows, n, generator=g) + 0.05, torch.randn(shape, generator=g) + 0.05
    fn = _build(chain, reduce_with)
    graph_module = trace_function(fn, x, y)
    search = find_regions(graph_module.graph)
    assert search.regions, search.refusals  # every chain has at least two fusible ops
    values = node_values(graph_module, x, y)
    for region in search.regions:
        generated = compile_region(region)
        inputs = [values[node.name] for node in region.input_nodes]
        for got, want in zip(generated.module.launch(*inputs), generated.module.reference(*inputs), strict=True):
            assert rel_err(got, want) < 1e-5 or (got - want).abs().max() < 1e-6
    run_passes(graph_module, [CodegenFuse()], strict=True)
    got, want = graph_module(x, y), fn(x, y)
    assert rel_err(got, want) < 1e-5 or (got - want).abs().max() < 1e-6
