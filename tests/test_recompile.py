"""Dynamo's recompile limit: each kopt.compile starts clean, and calls never run eagerly in silence.

Dynamo keeps compiled graphs per code object and stops compiling a frame after 8 entries; a call
that matches none of them then runs the model eagerly. Before kopt handled it, the 9th
``kopt.compile`` of one module in a process, and the 9th input shape of one compiled module, ran
eagerly with nothing but a "0 graph(s)" report.
"""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch

import kopt
from kopt import dynamo_cache
from tests.conftest import rel_err


class Siblings(torch.nn.Module):
    """Two linears reading one input: sibling-merge fires, so a compiled graph is visible."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x) * self.k(x)


class WithBreak(Siblings):
    """The same with a graph break in the middle: dynamo compiles two frames per call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.q(x) * self.k(x)
        torch._dynamo.graph_break()
        return self.q(y) * self.k(y)


def _model(cls: type = Siblings) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls().eval()


@pytest.fixture(params=["isolate_recompiles", "fresh code"])
def cache_path(request, monkeypatch):
    """Both ways kopt gives a compilation its own cache state: dynamo's isolate_recompiles (torch
    >= 2.13) and the wrapper with a code object of its own (torch 2.11, 2.12)."""
    if request.param == "isolate_recompiles" and not dynamo_cache.ISOLATES_RECOMPILES:
        pytest.skip("this torch has no isolate_recompiles")
    monkeypatch.setattr(dynamo_cache, "ISOLATES_RECOMPILES", request.param == "isolate_recompiles")
    return request.param


def test_compiling_the_same_module_again_starts_clean(cache_path):
    """Twelve kopt.compile calls of one module in one process (a notebook cell run again and
    again): every one compiles its own graph and runs it, with no eager fallback."""
    model, x = _model(), torch.randn(4, 16)
    with torch.no_grad():
        expected = model(x)
        for _ in range(12):
            compiled = kopt.compile(model, lower="eager")
            assert rel_err(compiled(x), expected) < 1e-6
            report = compiled.kopt_report
            assert len(report.graphs) == 1 and report.matches("sibling-merge") == 1, str(report)
            assert report.eager_calls == 0


def test_compiling_one_module_again_leaves_other_instances_compiled(cache_path):
    """Recompiling one instance of a class does not reset another instance's compiled graphs."""
    first, second, x = _model(), _model(), torch.randn(4, 16)
    other = kopt.compile(second, lower="eager")
    with torch.no_grad():
        other(x)
        for _ in range(10):
            kopt.compile(first, lower="eager")(x)
        assert rel_err(other(x), second(x)) < 1e-6
    assert len(other.kopt_report.graphs) == 1 and other.kopt_report.eager_calls == 0


def test_a_graph_breaking_model_compiled_again_starts_clean():
    """With a graph break, dynamo compiles the frames after the break too; with isolate_recompiles
    those are this compilation's own as well."""
    if not dynamo_cache.ISOLATES_RECOMPILES:
        pytest.skip("frames below a graph break share their code's cache before torch 2.13")
    model, x = _model(WithBreak), torch.randn(4, 16)
    with torch.no_grad():
        for _ in range(10):
            compiled = kopt.compile(model, lower="eager")
            assert rel_err(compiled(x), model(x)) < 1e-6
            assert len(compiled.kopt_report.graphs) == 2 and compiled.kopt_report.eager_calls == 0


def test_the_ninth_static_shape_warns_and_the_report_says_why():
    """dynamic=False gives a graph per shape; past dynamo's limit of 8 the calls run eagerly, and
    kopt says so: a warning naming the limit, and the report's count and reason."""
    model = _model()
    compiled = kopt.compile(model, lower="eager", dynamic=False)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in range(2, 12):
            x = torch.randn(rows, 16)
            assert rel_err(compiled(x), model(x)) < 1e-6
    fallbacks = [w for w in caught if issubclass(w.category, kopt.EagerFallbackWarning)]
    assert len(fallbacks) == 2 and "recompile_limit" in str(fallbacks[0].message)
    assert fallbacks[0].filename == __file__  # points at the caller, not at torch's module code
    report = compiled.kopt_report
    assert len(report.graphs) == 8 and report.eager_calls == 2
    assert "recompile_limit (8)" in report.eager_fallback and "size mismatch" in report.eager_fallback
    assert "EAGER FALLBACK: 2 call(s)" in str(report)


class TwoParts(Siblings):
    """A graph break between a part that reads ``x`` and a part that reads ``y``: only the frame
    after the break sees ``y``'s shape."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = self.q(x) * self.k(x)
        torch._dynamo.graph_break()
        return a.sum() + (self.q(y) * self.k(y)).sum()


def test_a_frame_after_a_graph_break_that_hits_the_limit_is_reported():
    """With dynamic=False and a ninth shape of ``y``, the frame after the graph break runs eagerly
    while the first one still runs kopt's graph: a warning and the report name the frame and why."""
    model, x = _model(TwoParts), torch.randn(4, 16)
    compiled = kopt.compile(model, lower="eager", dynamic=False)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in range(2, 12):
            y = torch.randn(rows, 16)
            assert rel_err(compiled(x, y), model(x, y)) < 1e-5
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, kopt.EagerFallbackWarning)]
    assert len(fallbacks) == 1 and "part of a call" in fallbacks[0] and "resume_in_forward" in fallbacks[0]
    report = compiled.kopt_report
    assert report.eager_calls == 0 and "size mismatch" in report.recompile_limit
    assert "EAGER FALLBACK for calls no compiled graph matches" in str(report)


def test_ten_lengths_with_the_default_settings_never_run_eagerly():
    """The default (dynamic=None): a static graph for the first length, then one symbolic graph for
    the nine others, rewritten by kopt like the static one; no call runs eagerly."""
    model = _model()
    compiled = kopt.compile(model, lower="eager")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", kopt.EagerFallbackWarning)
        for rows in range(3, 13):
            x = torch.randn(2, rows, 16)
            assert rel_err(compiled(x), model(x)) < 1e-6
    report = compiled.kopt_report
    assert len(report.graphs) == 2 and report.eager_calls == 0
    assert [next(p.total_matches for p in g.passes if p.name == "sibling-merge") for g in report.graphs] == [1, 1]


def test_a_call_that_compiles_no_graph_is_reported():
    """A forward with nothing to compile runs without any kopt graph: the report says so."""
    class Identity(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    compiled = kopt.compile(Identity(), lower="eager")
    with pytest.warns(kopt.EagerFallbackWarning, match="no graph"):
        compiled(torch.randn(3))
    assert compiled.kopt_report.eager_calls == 1


def test_a_dropped_compilation_frees_its_graphs():
    """Dynamo keeps every backend it was given until torch._dynamo.reset(); a compiled module that
    is garbage-collected must not keep its rewritten graph (and the weights derived for it)."""
    model, x = _model(), torch.randn(4, 16)
    compiled = kopt.compile(model, lower="eager")
    with torch.no_grad():
        compiled(x)
    graph_module = weakref.ref(compiled._kopt_backend.compiled[0].captured.graph_module)
    merged = [name for name, _ in graph_module().named_buffers() if name.startswith("_kopt_merged")]
    assert merged  # the concatenated weights of the merged siblings live in the graph module
    del compiled
    gc.collect()
    assert graph_module() is None
