"""Outputs that hold uninitialized memory: found in the graph, left out of the value checks."""

from __future__ import annotations

import torch

import kopt
from kopt.fx.aliasing import uninitialized_outputs
from tests.conftest import rel_err


def _hands_on_a_buffer(x: torch.Tensor):
    """Like SGLang's FLUX.2 at a graph break: a result, an empty buffer and a view of it for the next
    graph to fill, and an empty buffer this graph fills itself."""
    y = torch.relu(x @ x.t()) + torch.relu(x @ x.t())  # the same product twice: the redundancy pass fires
    buffer = x.new_empty((x.shape[0], 24))
    filled = torch.empty_like(x)
    filled.copy_(x * 3)
    return y, buffer, buffer[:, 8:], filled


def test_only_empty_tensors_nothing_writes_are_uninitialized():
    graph = torch.fx.symbolic_trace(_hands_on_a_buffer)
    assert uninitialized_outputs(graph) == {1, 2}


def test_verification_and_the_lowering_check_pass_on_a_graph_returning_empty_buffers():
    """Bit-identity would compare two reads of uninitialized memory; the check compares shape and dtype."""
    compiled = kopt.compile(_hands_on_a_buffer, lower="eager", verify=True, progress=False)
    x = torch.randn(6, 16)
    y, buffer, view, filled = compiled(x)
    graph = compiled.kopt_report.graphs[0]
    assert graph.fallback is None and compiled.kopt_report.matches("redundancy") > 0
    checks = {check["output"]: check for check in graph.verification}
    assert all(check["ok"] for check in checks.values())
    assert "uninitialized" in checks[1]["verdict"] and "uninitialized" in checks[2]["verdict"]
    assert checks[0]["verdict"] == checks[3]["verdict"] == "bit-identical"
    assert rel_err(y, 2 * torch.relu(x @ x.t())) < 1e-6 and rel_err(filled, 3 * x) < 1e-6
    assert buffer.shape == (6, 24) and view.shape == (6, 16)
