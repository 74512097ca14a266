"""Codegen test helpers: a private kernel cache, graph values by node, and the region of a function."""

from __future__ import annotations

import pytest
import torch

from kopt.codegen import find_regions
from kopt.codegen.region import Region
from kopt.fx.capture import trace_function


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Generated modules go to a per-session folder, never to the user's ~/.cache."""
    monkeypatch.setenv("KOPT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kopt-codegen-cache"))


class _Recorder(torch.fx.Interpreter):
    def __init__(self, graph_module: torch.fx.GraphModule) -> None:
        super().__init__(graph_module)
        self.values: dict[str, object] = {}

    def run_node(self, node: torch.fx.Node) -> object:
        self.values[node.name] = result = super().run_node(node)
        return result


def node_values(graph_module: torch.fx.GraphModule, *inputs: torch.Tensor) -> dict[str, object]:
    """Every node's value (by name) when ``graph_module`` runs on ``inputs``."""
    recorder = _Recorder(graph_module)
    with torch.no_grad():
        recorder.run(*inputs)
    return recorder.values


def only_region(fn, *inputs: torch.Tensor) -> tuple[torch.fx.GraphModule, Region]:
    """The traced graph of ``fn`` and the single region codegen finds in it."""
    graph_module = trace_function(fn, *inputs)
    search = find_regions(graph_module.graph)
    assert len(search.regions) == 1, (search.regions, search.refusals)
    return graph_module, search.regions[0]


def region_inputs(graph_module: torch.fx.GraphModule, region: Region, *inputs: torch.Tensor) -> list[torch.Tensor]:
    """The tensors ``region`` reads when the graph runs on ``inputs``."""
    values = node_values(graph_module, *inputs)
    return [values[node.name] for node in region.input_nodes]


def region_outputs(graph_module: torch.fx.GraphModule, region: Region, *inputs: torch.Tensor) -> list[torch.Tensor]:
    """The values of ``region``'s outputs in the unfused graph (the model's own arithmetic)."""
    values = node_values(graph_module, *inputs)
    return [values[node.name] for node in region.output_nodes]
