"""Region validation: what one row-wise kernel can compute, and the reasons it gives when it cannot."""

from __future__ import annotations

import torch

from kopt.codegen import build_region, find_regions
from kopt.codegen.region import Region
from kopt.fx.capture import trace_function


def _computing_nodes(graph_module: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in graph_module.graph.nodes if n.op == "call_function"]


def test_softmax_has_two_reductions_and_is_refused_whole():
    def softmax(x):
        e = (x - x.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True)

    graph_module = trace_function(softmax, torch.randn(5, 37))
    reason = build_region(_computing_nodes(graph_module))
    assert isinstance(reason, str) and reason.startswith("two reductions (amax") and "sum" in reason


def test_reduction_over_a_non_last_dim_is_refused():
    graph_module = trace_function(lambda x: (x * 2).sum(0, keepdim=True) + 1, torch.randn(5, 37))
    reason = build_region(_computing_nodes(graph_module))
    assert isinstance(reason, str) and "reduction over a non-last dim" in reason
    search = find_regions(graph_module.graph)
    assert any("non-last dim" in r for r in search.refusals.values())


def test_reduction_without_keepdim_is_an_output_or_unsqueezed_back():
    graph_module = trace_function(lambda x: (x * 2).sum(-1) * 0.5, torch.randn(2, 5, 37))
    region = build_region(_computing_nodes(graph_module))
    assert isinstance(region, Region) and [o.kind for o in region.outputs] == ["row_flat"]
    graph_module = trace_function(lambda x: x - x.mean(-1)[..., None], torch.randn(2, 5, 37))
    region = build_region(_computing_nodes(graph_module))
    assert isinstance(region, Region) and [o.kind for o in region.outputs] == ["full"]
    graph_module = trace_function(lambda x: x.mean(-1) + x[:, 0], torch.randn(7, 7, 7))  # (7, 7) + (7, 7)
    nodes = [n for n in _computing_nodes(graph_module) if n.target is not torch.ops.aten.select.int]
    reason = build_region(nodes)
    assert isinstance(reason, str) and "mixes a reduction without keepdim" in reason


def test_region_reading_a_row_broadcast_and_a_last_dim_broadcast_input():
    def fn(x, scale, row):
        return (x * (1 + scale) + row).exp()

    graph_module = trace_function(fn, torch.randn(2, 3, 8), torch.randn(2, 1, 8), torch.randn(2, 3, 1))
    region = build_region(_computing_nodes(graph_module))
    assert isinstance(region, Region)
    assert region.full_shape == (2, 3, 8) and region.reduction is None
    assert sorted(i.shape for i in region.inputs) == [(2, 1, 8), (2, 3, 1), (2, 3, 8)]


def test_a_region_value_needed_outside_at_a_broadcast_shape_is_refused():
    def fn(x, scale):
        s = scale + 1  # (B, 1, N): smaller than the rows, so not an output of a row kernel
        return x * s, s

    graph_module = trace_function(fn, torch.randn(2, 3, 8), torch.randn(2, 1, 8))
    reason = build_region(_computing_nodes(graph_module))
    assert isinstance(reason, str) and "smaller than the rows" in reason


def test_a_path_out_of_the_region_and_back_is_refused():
    def fn(x, w):
        a = x * 2
        b = a @ w  # outside: reads the region and feeds it
        return a + b

    graph_module = trace_function(fn, torch.randn(4, 4), torch.randn(4, 4))
    nodes = [n for n in _computing_nodes(graph_module) if n.target is not torch.ops.aten.mm.default]
    reason = build_region(nodes)
    assert isinstance(reason, str) and "feeds it back" in reason
    search = find_regions(graph_module.graph)
    assert search.regions == []  # neither side alone has two ops


def test_regions_are_maximal_and_disjoint():
    def fn(x, y):
        a = torch.tanh(x) * y + 1
        h = a @ y.t()
        return torch.sigmoid(h) * 3 - h

    graph_module = trace_function(fn, torch.randn(4, 6), torch.randn(4, 6))
    search = find_regions(graph_module.graph)
    assert [len(r.steps) for r in search.regions] == [3, 3]  # tanh-mul-add | sigmoid-mul-sub
    members = [set(r.members) for r in search.regions]
    assert not members[0] & members[1]
