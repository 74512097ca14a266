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
    monkeypatch.setattr(loop, "overrun", lambda evaluations, deadline, now, kind=None, recorded=(): original(
        evaluations, deadline, now) if kind is None else 3600.0 if kind is not CandidateKind.PASS_CHOICE else None)
    model, inputs = sigmoid_gelu_mlp()
    result = optimize(model, inputs, budget_min=5, kb_path=tmp_path / "kb.sqlite", clock="cost-model", seed=0,
                      model_name="mlp")
    assert result.deferred and all(c.kind is not CandidateKind.PASS_CHOICE for c in result.deferred)
    assert result.evaluations and all(e.candidate.kind is CandidateKind.PASS_CHOICE for e in result.evaluations)
    assert "not started, longer than the time left" in result.table()


def test_before_a_kind_is_timed_in_this_run_the_knowledge_base_s_times_stand_in():
    """A resumed run's first generated kernel costs what the earlier runs' did on this machine: their
    recorded times decide until this run has timed one; then this run's own times do."""
    from kopt.agent.candidate import CandidateKind
    kernel, choice = CandidateKind.CODEGEN_VARIANT, CandidateKind.PASS_CHOICE
    earlier = [58.0, 171.0, 90.0, 0.02]  # the last settled untimed: left out
    runs = [_Timed(10.0, _Kind(choice), object())]
    assert overrun(runs, deadline=540.0, now=500.0, kind=kernel, recorded=earlier) == 90.0
    assert overrun(runs, deadline=540.0, now=400.0, kind=kernel, recorded=earlier) is None
    own = runs + [_Timed(30.0, _Kind(kernel), object())]
    assert overrun(own, deadline=540.0, now=500.0, kind=kernel, recorded=earlier) is None  # 40 s left, ~30 s


def test_the_knowledge_base_keeps_each_evaluation_s_time_per_kind(tmp_path):
    """The store keeps how long an evaluation took (the loop's figure) and gives them back per kind for
    one environment; a record without a time hashes as records always did (the key is absent)."""
    from kopt.agent.candidate import Candidate, CandidateKind
    from kopt.agent.kb import KnowledgeBase, Status
    from kopt.passes.base import Contract
    from tests.agent.kb_helpers import GPU_ENV, candidate_for, scaled_gelu_region

    with KnowledgeBase(tmp_path / "kb.sqlite") as kb:
        region = scaled_gelu_region()
        kb.record_region(region, model="m")
        timed = kb.record_candidate(candidate_for(region, 1), status=Status.SLOWER, reason="0.3 % slower",
                                    environment=GPU_ENV, seconds=64.5)
        untimed = kb.record_candidate(candidate_for(region, 2), status=Status.SLOWER, reason="slower",
                                      environment=GPU_ENV)
        kernel = Candidate(region.signature, CandidateKind.CODEGEN_VARIANT, "def candidate(b, x):\n    return x\n",
                           Contract.tolerance(1e-5), why="t", origin="test")
        kb.record_candidate(kernel, status=Status.REJECTED, reason="wrong", environment=GPU_ENV, seconds=120.0)
        kb.record_candidate(candidate_for(region, 3), status=Status.SLOWER, reason="elsewhere",
                            environment=kb.record_environment(), seconds=5.0)
        assert kb.candidate(timed.record_hash).seconds == 64.5
        assert "seconds" not in untimed.content() and kb.candidate(untimed.record_hash).seconds is None
        assert kb.evaluation_seconds(GPU_ENV) == {CandidateKind.RULE_BY_EXAMPLE.value: [64.5],
                                                  CandidateKind.CODEGEN_VARIANT.value: [120.0]}


def test_the_loop_records_each_evaluation_s_time_and_reads_them_back_on_resume(tmp_path, monkeypatch):
    """Through the real loop (CPU, cost model): every evaluation's time is in its record, and a run over
    that file hands those times, per kind, to the budget rule."""
    import kopt.agent.loop as loop
    from kopt.agent import optimize
    from kopt.agent.kb import KnowledgeBase
    from tests.agent.tiny_models import sigmoid_gelu_mlp

    model, inputs = sigmoid_gelu_mlp()
    path = tmp_path / "kb.sqlite"
    first = optimize(model, inputs, budget_min=5, kb_path=path, clock="cost-model", seed=0, model_name="mlp",
                     max_candidates=4)
    assert first.evaluations
    with KnowledgeBase(path) as kb:
        recorded = kb.evaluation_seconds(kb.record_environment())
        by_hash = {r.candidate_hash: r.seconds for r in kb.candidates()}
    for evaluation in first.evaluations:
        assert by_hash[evaluation.candidate.content_hash] == evaluation.seconds
    handed = []
    original = loop.overrun

    def spy(evaluations, deadline, now, kind=None, recorded=()):
        if kind is not None:
            handed.append((kind.value, list(recorded)))
        return original(evaluations, deadline, now, kind, recorded)

    monkeypatch.setattr(loop, "overrun", spy)
    optimize(model, inputs, budget_min=5, kb_path=path, clock="cost-model", seed=0, model_name="mlp")
    assert handed and all(seconds == recorded.get(kind, []) for kind, seconds in handed)
    assert any(seconds for _, seconds in handed)
