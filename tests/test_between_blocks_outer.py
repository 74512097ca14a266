"""``between_blocks="outer"``: the model's code around the module that runs its blocks is compiled,
that module's call opaque to it (:mod:`kopt.between_blocks`). An LLM's LM head and logit soft cap
become one graph, the blocks keep one compiled graph per class, weights outside the blocks are never
released, a model that runs its blocks itself is refused, and ``undo()`` gives the module back."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import kopt
from kopt.between_blocks import is_opaque, trunk
from kopt.fp8 import Fp8Config
from kopt.reference import reference_forward
from kopt.release import is_released
from kopt.workloads import get_workload
from tests.conftest import rel_err
from tests.test_regional_between_blocks import _TiedLM, tiny_lm


def _targets(compiled: kopt.regional.KoptRegional) -> list[set[str]]:
    """Per compiled graph, the names of the functions dynamo's graph calls."""
    return [{getattr(n.target, "__name__", str(n.target)) for n in g.dynamo_graph.graph.nodes
             if n.op == "call_function"} for g in compiled._kopt_backend.compiled]


def _untouched(model: nn.Module) -> bool:
    return all(getattr(m, "_compiled_call_impl", None) is None and "forward" not in m.__dict__
               and not is_opaque(m) for m in model.modules())


def _gemma2() -> tuple[nn.Module, dict]:
    workload = get_workload("gemma2")
    torch.manual_seed(0)
    model = workload.build_model("tiny").eval().requires_grad_(False)
    inputs = workload.build_inputs("tiny", torch.device("cpu"), torch.float32, torch.Generator().manual_seed(1), False)
    return model, inputs


class _Trunk(nn.Module):
    """Runs the blocks, as an LLM's inner model does."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.embed, self.layers = lm.embed, lm.layers

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return h


class _CappedLM(nn.Module):
    """A trunk, then an LM head with Gemma 2's logit soft cap, the head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        lm = _TiedLM()
        self.model, self.head = _Trunk(lm), lm.head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.head(self.model(ids)) / 30.0) * 30.0


def test_an_llms_lm_head_and_logit_soft_cap_become_one_graph():
    """Gemma 2 caps its logits in the top-level forward, after the LM head: eager code under
    ``"eager"``, one graph with the head under ``"outer"``; the decoder layers stay one graph."""
    model, inputs = _gemma2()
    assert trunk(model, list(model.model.layers)) is model.model
    with torch.no_grad():
        eager = model(**inputs)[0]
        exact = reference_forward(model, **inputs)[0]
        compiled = kopt.compile(model, regional=True, lower="eager", between_blocks="outer", progress=False)
        out = compiled(**inputs)[0]
        again = compiled(**inputs)[0]
    targets = _targets(compiled)
    assert compiled.blocks == ["Gemma2DecoderLayer"]
    assert len(targets) == 2 and any({"linear", "tanh"} <= t for t in targets), targets
    assert compiled.kopt_report.graph_breaks == []  # the break at the trunk is by design, not reported
    assert rel_err(out, exact) <= 2 * rel_err(eager, exact) + 1e-6 and torch.equal(out, again)
    compiled.undo()
    assert _untouched(model)
    with torch.no_grad():
        assert torch.equal(model(**inputs)[0], eager)


def test_a_model_that_runs_its_blocks_itself_is_refused_with_the_reason():
    model = tiny_lm()  # its own forward loops over the layers
    with pytest.raises(ValueError, match="own forward runs its blocks"):
        kopt.compile(model, regional=True, lower="eager", between_blocks="outer")
    assert _untouched(model)
    with pytest.raises(ValueError, match="is for regional=True"):
        kopt.compile(model, between_blocks="outer")


def test_the_trunks_hooks_and_instance_forward_survive():
    """A hook library's instance ``forward`` on the trunk (diffusers' hooks set one) is what runs inside,
    and what ``undo()`` puts back."""
    torch.manual_seed(0)
    model = _CappedLM().eval().requires_grad_(False)
    calls = []
    plain = model.model.forward

    def hooked(ids: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return plain(ids)

    model.model.forward = hooked
    ids = torch.randint(0, 1536, (1, 8))
    with torch.no_grad():
        eager = model(ids)
        calls.clear()
        compiled = kopt.compile(model, regional=True, lower="eager", between_blocks="outer", progress=False)
        out = compiled(ids)
        out = compiled(ids)
        assert calls == [1, 1] and rel_err(out, eager) < 1e-5
        compiled.undo()
    assert model.model.forward is hooked and not is_opaque(model.model)


def test_weights_outside_the_blocks_are_never_released():
    """The LM head's FP8 copy leaves its weight unread by any graph, but the embedding, which the trunk
    runs as written, reads the same tensor: only the blocks' unread originals are freed."""
    torch.manual_seed(0)
    model = _CappedLM().eval().requires_grad_(False)
    ids = torch.randint(0, 1536, (1, 8))
    with torch.no_grad():
        exact = reference_forward(model, ids)
        compiled = kopt.compile(model, regional=True, lower="eager", fp8=Fp8Config(min_features=16),
                                release_weights=True, between_blocks="outer", progress=False)
        first = compiled(ids)
        second = compiled(ids)
    graphs = compiled.kopt_report.graphs
    assert sum(any(r.name == "fp8-linear" and r.matches for r in g.passes) for g in graphs) == 2  # block, head
    assert compiled.kopt_report.released_bytes > 0
    assert not is_released(model.model.embed.weight) and model.model.embed.weight is model.head.weight
    assert any(is_released(p) for p in model.model.layers.parameters())
    assert torch.equal(first, second) and 0 < rel_err(second, exact) < 0.1


def test_the_agents_clock_puts_each_sides_entry_points_back():
    """The agent's A/B sides share one module; with ``"outer"`` a side is the model's compiled call, the
    blocks' and the trunk's opaque forward; checking the model as written clears them, then each
    side's come back, and closing the clock leaves the module as it was."""
    from kopt.agent.regional_clock import RegionalClock
    from kopt.passes.base import Contract

    torch.manual_seed(0)
    model = _CappedLM().eval().requires_grad_(False)
    ids = torch.randint(0, 1536, (1, 8))
    clock = RegionalClock(model, (ids,), lower="eager", between_blocks="outer")
    try:
        assert len(clock.samples({}, 2, 0)) == 2
        rows = clock.model_checks({}, Contract.tolerance(1e-5), seed=3)
        assert rows and all(r["ok"] for r in rows)
        assert is_opaque(model.model) and model._compiled_call_impl is not None  # the side again
        assert len(clock.report({}).graphs) == 2  # the block class and the head with its cap
    finally:
        clock.close()
    assert _untouched(model)


def test_a_side_that_runs_code_eagerly_is_an_error_not_a_timing(monkeypatch):
    """Without ``isolate_recompiles`` (torch < 2.13) every side's compile of the model's own forward
    shares one dynamo cache: the clock makes room for one entry per side, and a side dynamo gave up
    on anyway is refused with the reason instead of timed."""
    import torch._dynamo.config as dynamo_config

    import kopt.dynamo_cache
    from kopt.agent.regional_clock import _room_for_every_side, side_problem
    from kopt.report import Report

    report = Report(recompile_limit="torch._dynamo hit config.recompile_limit (8)")
    assert "runs code eagerly" in side_problem(report) and side_problem(Report()) == ""
    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    before = getattr(dynamo_config, name)
    monkeypatch.setattr(kopt.dynamo_cache, "ISOLATES_RECOMPILES", False)
    with _room_for_every_side("outer"):
        assert getattr(dynamo_config, name) >= 256
    with _room_for_every_side("eager"):
        assert getattr(dynamo_config, name) == before
    assert getattr(dynamo_config, name) == before
