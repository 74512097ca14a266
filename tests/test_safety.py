"""A broken pass never breaks the model: raising passes are skipped, wrong ones caught by verify."""

from __future__ import annotations

import pytest
import torch

import kopt
from kopt.passes.manager import PassFailed
from tests.conftest import rel_err

aten = torch.ops.aten


def _raise(graph_module, ctx):
    ctx.fire("boom", "graph")
    raise RuntimeError("deliberate failure")


def _corrupt(graph_module, ctx):
    """Breaks the graph, then raises: the manager must restore the original graph."""
    for node in graph_module.graph.nodes:
        if node.op == "output":
            node.args = (tuple(None for _ in node.args[0]),)
    raise RuntimeError("deliberate failure after corrupting the graph")


def _wrong_gelu(graph_module, ctx):
    """Claims to be exact but replaces every gelu/silu by relu."""
    for node in graph_module.graph.nodes:
        if node.target in (aten.gelu.default, aten.silu.default) and ctx.fire("to-relu", node):
            node.target, node.kwargs = aten.relu.default, {}


RAISING = kopt.FunctionPass("raising", "test: raises", kopt.Contract.exact(), _raise)
CORRUPTING = kopt.FunctionPass("corrupting", "test: corrupts then raises", kopt.Contract.exact(), _corrupt)
WRONG = kopt.FunctionPass("wrong", "test: silently wrong", kopt.Contract.exact(), _wrong_gelu)


def test_raising_pass_is_skipped_and_recorded(tiny_dit):
    """The model still runs, bit-identical, and the report names the error."""
    _workload, model, inputs = tiny_dit
    compiled = kopt.compile(model, passes=[CORRUPTING, RAISING], lower="eager")
    with torch.no_grad():
        assert torch.equal(compiled(**inputs)[0], model(**inputs)[0])
    records = compiled.kopt_report.graphs[0].passes
    assert [r.status.split(":")[0] for r in records] == ["skipped", "skipped"]
    assert "deliberate failure" in records[1].status and records[1].total_matches == 0


def test_raising_pass_raises_under_strict():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    compiled = kopt.compile(model, passes=[RAISING], lower="eager", strict=True)
    with torch.no_grad(), pytest.raises(PassFailed, match="deliberate failure"):
        compiled(torch.randn(2, 8))


def test_wrong_pass_is_caught_by_verify_and_falls_back(tiny_dit):
    """verify=True detects the contract violation, runs the original graph and says so."""
    workload, model, inputs = tiny_dit
    compiled = kopt.compile(model, passes=[WRONG], lower="eager", verify=True)
    with torch.no_grad():
        reference = model(**inputs)[0]
        assert torch.equal(compiled(**inputs)[0], reference)
        fresh = workload.inputs("tiny", seed=123)
        assert torch.equal(compiled(**fresh)[0], model(**fresh)[0])
    graph = compiled.kopt_report.graphs[0]
    assert graph.passes[0].total_matches > 0
    assert graph.fallback is not None and "verification failed" in graph.fallback
    assert not graph.verification[0]["ok"] and graph.verification[0]["rel_err"] > 1e-3
    assert "FALLBACK" in str(compiled.kopt_report)


def test_wrong_pass_without_verify_is_really_wrong():
    """Guards the test above: without verify the wrong rewrite does change the output."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    compiled = kopt.compile(model, passes=[WRONG], lower="eager")
    x = torch.randn(16, 8)
    with torch.no_grad():
        assert rel_err(compiled(x), model(x)) > 1e-2


def test_verify_failure_raises_under_strict():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    compiled = kopt.compile(model, passes=[WRONG], lower="eager", verify=True, strict=True)
    with torch.no_grad(), pytest.raises(kopt.VerificationFailed, match="not bit-identical"):
        compiled(torch.randn(4, 8))


def test_pass_manager_strict_error_type():
    model = torch.nn.Linear(8, 8).eval()
    compiled = kopt.compile(model, passes=[RAISING], lower="eager", strict=True)
    with torch.no_grad(), pytest.raises(PassFailed, match="'raising' raised: deliberate failure"):
        compiled(torch.randn(2, 8))


def _explode(*args, **kwargs):
    raise RuntimeError("deliberate capture/lowering failure")


def test_capture_failure_falls_back_to_the_original_graph(monkeypatch, caplog):
    """Even a crash in kopt's own capture leaves the model running, with the reason reported and
    logged as a warning (a run's log shows it without the report)."""
    import kopt.backend

    monkeypatch.setattr(kopt.compiled_graph, "capture", _explode)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    compiled = kopt.compile(model, lower="eager")
    x = torch.randn(3, 8)
    with torch.no_grad(), caplog.at_level("WARNING", logger="kopt"):
        assert torch.equal(compiled(x), model(x))
    assert "capture failed: RuntimeError: deliberate" in compiled.kopt_report.graphs[0].fallback
    assert any("capture failed: RuntimeError: deliberate" in r.getMessage() and r.levelname == "WARNING"
               for r in caplog.records)


def test_lowering_failure_falls_back_and_strict_raises(monkeypatch):
    import kopt.backend

    monkeypatch.setattr(kopt.compiled_graph.CompiledGraph, "_lower_rewritten", _explode)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8)).eval()
    x = torch.randn(3, 8)

    class Twice(torch.nn.Module):  # a repeated subexpression, so that a rewrite fires
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, x):
            return self.inner(x) + self.inner(x)

    compiled = kopt.compile(Twice().eval(), lower="eager")
    with torch.no_grad():
        assert torch.equal(compiled(x), model(x) + model(x))
    assert "lowering the rewritten graph failed" in compiled.kopt_report.graphs[0].fallback
    torch._dynamo.reset()
    strict = kopt.compile(Twice().eval(), lower="eager", strict=True)
    with torch.no_grad(), pytest.raises(Exception, match="deliberate"):
        strict(x)
