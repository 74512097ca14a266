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
