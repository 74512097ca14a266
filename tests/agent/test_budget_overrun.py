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
