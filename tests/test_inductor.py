"""End to end with Inductor on the CPU (slow: tens of seconds per graph on 2 cores)."""

from __future__ import annotations

import pytest
import torch

import kopt
from kopt.workloads import get_workload
from tests.conftest import rel_err


@pytest.mark.slow
def test_tiny_flux2_through_inductor():
    """The rewritten graph, with frozen constants, lowers through Inductor and stays accurate."""
    workload = get_workload("flux2")
    torch.manual_seed(0)
    model = workload.model("tiny")
    compiled = kopt.compile(model, verify=True)
    with torch.no_grad():
        for seed in (11, 12):
            inputs = workload.inputs("tiny", seed=seed)
            assert rel_err(compiled(**inputs)[0], model(**inputs)[0]) < 1e-5
    graph = compiled.kopt_report.graphs[0]
    assert graph.lowering == "inductor" and graph.fallback is None
    assert compiled.kopt_report.matches("redundancy") > 0
