"""Micro pruning's Amdahl bound: a candidate whose best case cannot move the model call by
``min_gain`` is stopped before the end-to-end A/B; one that can is let through."""

from __future__ import annotations

import pytest

from kopt.agent.micro import MicroBench

SIG = "a" * 64


def _bench(occurrences: int, model_s: float | None) -> MicroBench:
    return MicroBench(clock=None, min_gain=0.01, occurrences={SIG: occurrences}, model_s=model_s)


def test_a_region_too_small_to_move_the_call_cannot_reach_the_bar():
    # 1 occurrence saving 0.05 ms of a 75 ms call: 0.07 %
    reachable, text = _bench(1, 0.075).reachable(SIG, 0.05)
    assert not reachable and "0.07% of a 75 ms call" in text


def test_enough_occurrences_reach_it():
    # 27 occurrences saving 0.05 ms each of a 75 ms call: 1.8 %
    reachable, text = _bench(27, 0.075).reachable(SIG, 0.05)
    assert reachable and "27 occurrence(s)" in text


def test_no_bound_before_a_model_call_was_timed_or_for_an_unknown_region():
    assert _bench(1, None).reachable(SIG, 0.0001) == (True, "")
    assert _bench(1, 0.075).reachable("b" * 64, 0.0001) == (True, "")


def test_the_base_is_the_shortest_call_seen():
    bench = _bench(10, None)
    bench.saw_model_call(0.080)
    bench.saw_model_call(0.075)
    bench.saw_model_call(0.090)
    assert bench.model_s == 0.075
    # 10 x 0.075 ms of 75 ms = 1.0 %: at the bar
    assert bench.reachable(SIG, 0.075)[0]
    assert not bench.reachable(SIG, 0.07)[0]


def test_the_baseline_is_inductors_lowering_only_under_an_inductor_a_b_on_a_gpu():
    import types

    from kopt.agent.micro import MicroBench
    from kopt.agent.verify import TimingConfig

    gpu, cpu = TimingConfig(device="cuda:0"), TimingConfig(device="cpu")
    assert MicroBench(types.SimpleNamespace(lower="inductor"), timing=gpu).lowered
    assert not MicroBench(types.SimpleNamespace(lower="eager"), timing=gpu).lowered
    assert not MicroBench(types.SimpleNamespace(lower="inductor"), timing=cpu).lowered


@pytest.mark.parametrize(("lowered_fails", "want_timed", "want_against"), [
    (False, ["inductor"], "the original region as Inductor lowers it"),
    (True, ["inductor", "op by op"], "the original region op by op (Inductor's lowering of it alone: "
                                     "timing failed: timing-tamper: torch.manual_seed replaced)")])
def test_the_lowered_baseline_falls_back_to_op_by_op_and_says_so(monkeypatch, lowered_fails, want_timed,
                                                                 want_against):
    """Where Inductor cannot time the region alone, the op-by-op time stands in, and the reason a
    rejection gives names which baseline was timed."""
    import types

    from kopt.agent.verify import TimingConfig

    timed = []

    def harness(self, region, candidate):
        lowered = dict(candidate.params).get("lowered")
        timed.append(lowered or "op by op")
        return "timing failed: timing-tamper: torch.manual_seed replaced" if lowered and lowered_fails else [1.0] * 20

    monkeypatch.setattr(MicroBench, "_harness_ms", harness)
    region = types.SimpleNamespace(signature=SIG, source="def region(x):\n    return x\n")
    bench = MicroBench(types.SimpleNamespace(lower="inductor"), timing=TimingConfig(device="cuda:0"))
    assert bench._incumbent_ms(types.SimpleNamespace(region=region), None) == [1.0] * 20
    assert timed == want_timed and bench._against[SIG] == want_against
