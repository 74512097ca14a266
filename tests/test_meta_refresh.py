"""Metadata after a pass is recomputed only where the pass changed the graph, and equals what a
whole-graph FakeTensor propagation gives."""

from __future__ import annotations

import pytest
import torch

import kopt
from kopt.fx.graph_utils import refresh_meta
from kopt.fx.meta_refresh import _metadata, refresh, signatures
from tests.conftest import tiny_model_and_inputs


class Chain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x, y):
        return self.b(torch.relu(self.a(x))).sum(-1), torch.tanh(y) * 2


def _traced() -> torch.fx.GraphModule:
    module = torch.fx.symbolic_trace(Chain())
    refresh_meta(module, [torch.randn(4, 8), torch.randn(3, 5)])
    return module


def _all_metadata(module: torch.fx.GraphModule) -> dict[str, object]:
    return {n.name: _metadata(n.meta["val"]) for n in module.graph.nodes if "val" in n.meta}


def test_a_changed_node_and_everything_downstream_of_a_new_shape_is_recomputed():
    module = _traced()
    before = signatures(module.graph)
    relu = next(n for n in module.graph.nodes if n.target is torch.relu)
    with module.graph.inserting_after(relu):  # x -> relu(x)[:, :4] padded back: same shape, new nodes
        narrow = module.graph.call_function(torch.narrow, (relu, 1, 0, 4))
    relu.replace_all_uses_with(narrow, delete_user_cb=lambda user: user is not narrow)
    b = next(n for n in module.graph.nodes if n.op == "call_module" and n.target == "b")
    module.b = torch.nn.Linear(4, 6)  # the new shape flows into b, the sum and the output
    module.recompile()
    recomputed = refresh(module, before)
    incremental = _all_metadata(module)
    assert incremental[b.name][0][0] == "(4, 6)"
    assert incremental["sum_1"][0][0] == "(4,)"
    untouched = [n for n in module.graph.nodes if n.target in (torch.tanh,)]
    assert untouched and recomputed < len(module.graph.nodes) - 1  # the tanh branch was not run again
    refresh_meta(module)
    assert _all_metadata(module) == incremental


def test_metadata_of_an_unchanged_graph_is_not_recomputed():
    module = _traced()
    before = signatures(module.graph)
    assert refresh(module, before) == 1  # only the output node, which is always recorded again


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("name", ["qwen-image", "flux2", "wan"])
def test_every_default_pass_agrees_with_a_whole_graph_propagation(name, dynamic, monkeypatch):
    """``KOPT_CHECK_META=1`` compares the incremental metadata with a whole-graph propagation after
    every pass and raises on a difference, which would show as a skipped pass."""
    monkeypatch.setenv("KOPT_CHECK_META", "1")
    _, model, inputs = tiny_model_and_inputs(name, seed=5, dtype=torch.float32)
    compiled = kopt.compile(model, lower="eager", dynamic=dynamic)
    with torch.no_grad():
        compiled(**inputs)
    passes = [p for g in compiled.kopt_report.graphs for p in g.passes]
    assert not [p.status for p in passes if p.status.startswith("skipped")]
    assert sum(p.total_matches for p in passes) > 0
