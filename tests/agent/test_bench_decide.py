"""The end-to-end verdict (``kopt.agent.bench.decide``): a win needs the whole bootstrap CI above
no change and a median gain of at least the bar; the reason says which way it failed."""

from __future__ import annotations

import pytest

from kopt.agent.bench import decide
from kopt.agent.kb.records import Measurement


def _speedup(median: float, low: float, high: float) -> Measurement:
    return Measurement("speedup", median, low, high, 20, baseline=0.1)


@pytest.mark.parametrize(("median", "low", "high", "accepted", "says"), [
    (1.0300, 1.0200, 1.0400, True, "end-to-end win"),
    (1.0073, 1.0044, 1.0181, False, "gain below 1%"),
    (1.0054, 0.9994, 1.0153, False, "the CI includes no gain"),
    (0.9887, 0.9834, 0.9955, False, "slower, the whole CI lies below no change"),
])
def test_the_verdict_and_its_reason(median, low, high, accepted, says):
    ok, reason = decide(_speedup(median, low, high), [], 0.01)
    assert ok is accepted and says in reason and f"{median:.4f}x" in reason


def test_a_check_outside_the_contract_rejects_even_a_win():
    check = {"ok": False, "verdict": "cosine 0.98 < 0.999", "graph": 0}
    ok, reason = decide(_speedup(1.05, 1.04, 1.06), [check], 0.01)
    assert not ok and reason.startswith("model output outside the contract: cosine 0.98")
