"""The loop does not start a candidate whose end-to-end evaluation cannot finish within the budget."""

from __future__ import annotations

import dataclasses

from kopt.agent.loop import overrun


@dataclasses.dataclass
class _Evaluation:
    seconds: float
    e2e: object | None


def test_no_estimate_before_an_end_to_end_evaluation():
    settled_early = [_Evaluation(5.0, None), _Evaluation(8.0, None)]  # micro or unchanged-graph verdicts
    assert overrun(settled_early, deadline=100.0, now=99.0) is None
    assert overrun([], deadline=100.0, now=99.0) is None


def test_stops_when_less_than_the_median_end_to_end_evaluation_is_left():
    runs = [_Evaluation(40.0, object()), _Evaluation(80.0, object()), _Evaluation(38.0, object()),
            _Evaluation(6.0, None)]
    assert overrun(runs, deadline=300.0, now=200.0) is None  # 100 s left, an A/B takes 40 s
    assert overrun(runs, deadline=300.0, now=265.0) == 40.0  # 35 s left


def test_the_table_says_when_a_side_was_not_replayed():
    """A side of the A/B that could not be recorded as a CUDA graph ran as plain calls: the run's
    table says so, with the reason, so a launch-bound win is not mistaken for a replayed one."""
    from types import SimpleNamespace

    from kopt.agent.report import candidate_table

    clock = SimpleNamespace(name="wall-inductor-graphs", unreplayed={("abc",): "operation not permitted when "
                                                                               "stream is capturing"})
    result = SimpleNamespace(evaluations=[], skipped=0, resumed={}, clock=clock, elapsed_s=1.0, stopped="",
                             verified_ahead=[])
    table = candidate_table(result)
    assert "1 side(s) of the A/B ran as plain calls" in table and "stream is capturing" in table
    clock.unreplayed = {}
    assert "plain calls" not in candidate_table(result)


@dataclasses.dataclass
class _Kind:
    kind: object


@dataclasses.dataclass
class _Timed:
    seconds: float
    candidate: _Kind
    e2e: object | None = None


def test_a_kind_whose_evaluations_took_longer_than_is_left_does_not_start():
    from kopt.agent.candidate import CandidateKind
    kernel, choice = CandidateKind.CODEGEN_VARIANT, CandidateKind.PASS_CHOICE
    runs = [_Timed(8.0, _Kind(choice), object()), _Timed(12.0, _Kind(choice), object()),
            _Timed(156.0, _Kind(kernel)), _Timed(71.0, _Kind(kernel), object()), _Timed(60.0, _Kind(kernel))]
    assert overrun(runs, deadline=540.0, now=512.0) is None  # 28 s left, the median A/B took 12 s
    assert overrun(runs, deadline=540.0, now=512.0, kind=kernel) == 71.0  # a generated kernel: ~71 s
    assert overrun(runs, deadline=540.0, now=512.0, kind=choice) is None  # a pipeline choice still fits
    assert overrun(runs, deadline=540.0, now=400.0, kind=kernel) is None
    assert overrun([], deadline=540.0, now=539.0, kind=kernel) is None  # nothing of the kind timed yet
    settled = [_Timed(0.01, _Kind(kernel)) for _ in range(5)]  # "changes nothing": nothing was run
    assert overrun(runs + settled, deadline=540.0, now=512.0, kind=kernel) == 71.0


def test_the_loop_defers_a_kind_that_would_outlast_the_budget_and_runs_the_others(tmp_path, monkeypatch):
    """Wired into the real loop (CPU, cost model): with every region candidate's kind said to outlast
    the budget, none starts and each is listed as deferred; the pipeline choices still run."""
    import kopt.agent.loop as loop
    from kopt.agent import optimize
    from kopt.agent.candidate import CandidateKind
    from tests.agent.tiny_models import sigmoid_gelu_mlp

    original = loop.overrun
    monkeypatch.setattr(loop, "overrun", lambda evaluations, deadline, now, kind=None: original(
        evaluations, deadline, now) if kind is None else 3600.0 if kind is not CandidateKind.PASS_CHOICE else None)
    model, inputs = sigmoid_gelu_mlp()
    result = optimize(model, inputs, budget_min=5, kb_path=tmp_path / "kb.sqlite", clock="cost-model", seed=0,
                      model_name="mlp")
    assert result.deferred and all(c.kind is not CandidateKind.PASS_CHOICE for c in result.deferred)
    assert result.evaluations and all(e.candidate.kind is CandidateKind.PASS_CHOICE for e in result.evaluations)
    assert "not started, longer than the time left" in result.table()
