"""Micro pruning: time a region candidate alone before paying for an end-to-end A/B.

A candidate that is not faster than the region it replaces, at the region's own shapes, cannot make
the model faster through that region (the end-to-end A/B can only add layout and cache effects on
top), so it is stopped here: a few hundred milliseconds instead of a whole-model benchmark. The bar
is ``min_gain`` (1%): the region-level speedup's median must reach it. A candidate that passes is
also stopped when even its best case cannot move the model by ``min_gain`` (Amdahl): the time it
saves per occurrence at the fast end of its CI, times the region's occurrences per call, over the
shortest model call the end-to-end A/B has timed (no bound before the first). Inside the compiled
model the original region can only get cheaper than alone (the compiler fuses it with its
neighbours), so the bound errs toward measuring. The numbers land in the KB as the record's
``micro`` measurement (candidate ms per call, the original's as baseline).

Under an end-to-end A/B that lowers with Inductor on a GPU, "the region it replaces" is the region
as Inductor lowers it alone (:func:`kopt.agent.candidate.lowered_original_candidate`), not the region
run op by op: a candidate that only beats unfused ops would pass here and then lose a whole-model
A/B to Inductor's own fusion. Where Inductor cannot lower the region alone, it is timed op by op (an
upper bound of what it costs), and the reason says so.

Clocks: the sandboxed harness (:func:`kopt.agent.verify.time_candidate`, a fresh child process per
candidate, on the device the model runs on; the original region is timed once per region and cached)
or, with the deterministic cost model, its region times (:meth:`kopt.agent.cost_model.CostModel.candidate_s`).
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Mapping
from typing import Any

import torch

from kopt.agent.bench import bootstrap_median
from kopt.agent.candidate import Candidate, lowered_original_candidate, original_candidate
from kopt.agent.kb.records import Measurement
from kopt.agent.verify.config import TimingConfig


def timing_config(device: torch.device) -> TimingConfig:
    """Time region candidates where the model runs: a CPU time says nothing about a GPU kernel."""
    if device.type != "cuda":
        return TimingConfig()
    index = device.index if device.index is not None else torch.cuda.current_device()
    return TimingConfig(device=f"cuda:{index}")


@dataclasses.dataclass(frozen=True)
class MicroResult:
    passed: bool
    reason: str
    measurement: Measurement | None
    inconclusive: bool = False  # could not run for want of device memory: says nothing of the candidate


class MicroBench:
    """Region-level timing of candidates, the original's timing cached per region."""

    def __init__(self, clock: Any, verify_config: Any = None, *, min_gain: float = 0.01, resamples: int = 1000,
                 seed: int = 0, timing: Any = None, occurrences: Mapping[str, int] | None = None,
                 model_s: float | None = None) -> None:
        self.clock, self.verify_config, self.min_gain, self.timing = clock, verify_config, min_gain, timing
        self.resamples, self.seed = resamples, seed
        self.occurrences = dict(occurrences or {})  # per region signature, per model call
        self.model_s = model_s  # the shortest time of one model call seen so far (the Amdahl bound's base)
        self._original_ms: dict[str, list[float]] = {}
        self._against: dict[str, str] = {}  # per key of _original_ms: what was timed
        device = str(getattr(timing, "device", "cpu"))
        # what the region runs now in the end-to-end A/B: Inductor's lowering of it on a GPU (on the CPU
        # the timing sandbox refuses the compiler's processes, and C++ compiles take tens of seconds)
        self.lowered = getattr(clock, "lower", "eager") == "inductor" and device.startswith("cuda")

    def saw_model_call(self, seconds: float) -> None:
        """An end-to-end baseline time: the bound's base becomes the shortest seen (a larger share for
        each region, so the bound stays an upper bound)."""
        if seconds > 0:
            self.model_s = seconds if self.model_s is None else min(self.model_s, seconds)

    def reachable(self, signature: str, saved_ms_each: float, occurrences: int | None = None) -> tuple[bool, str]:
        """Amdahl: a candidate saving at most ``saved_ms_each`` per occurrence saves at most that times
        the region's occurrences per call (``occurrences``, else the count recorded for ``signature``);
        below ``min_gain`` of a call the A/B cannot accept it."""
        count = occurrences if occurrences is not None else self.occurrences.get(signature)
        if not count or not self.model_s:
            return True, ""
        model_ms = self.model_s * 1e3
        bound = count * max(0.0, saved_ms_each) / model_ms
        text = (f"{count} occurrence(s) x at most {saved_ms_each:.4g} ms saved = {bound:.2%} of a "
                f"{model_ms:.4g} ms call")
        return bound >= self.min_gain, text

    def _cost_model_ms(self, occurrence: Any, candidate: Candidate | None, stream: int) -> list[float]:
        model = self.clock.model
        seconds = model.occurrence_s(occurrence) if candidate is None else model.candidate_s(occurrence, candidate)
        rng = random.Random(self.seed * 7_919 + stream)
        return [seconds * 1e3 * (1.0 + rng.gauss(0.0, self.clock.noise)) for _ in range(20)]

    def _harness_ms(self, region: Any, candidate: Candidate) -> list[float] | str:
        from kopt.agent.verify import time_candidate

        timing, checks = time_candidate(region, candidate, self.verify_config, self.timing)
        if timing is None:
            failed = next((c for c in checks if not c.passed), None)
            return f"timing failed: {failed.name}: {failed.detail}" if failed else "timing failed"
        return [ns / 1e6 for ns in timing.samples_ns]

    def _incumbent_ms(self, occurrence: Any, incumbent: Candidate | None) -> list[float] | str:
        """The time of what the region runs now: the accepted candidate, else the original region."""
        if self.cost_model:
            return self._cost_model_ms(occurrence, incumbent, 0)
        region = occurrence.region
        key = incumbent.content_hash if incumbent else region.signature
        if key not in self._original_ms:
            measured, against = self._timed_incumbent(region, incumbent)
            if isinstance(measured, str):
                return measured
            self._original_ms[key], self._against[key] = measured, against
        return self._original_ms[key]

    def _timed_incumbent(self, region: Any, incumbent: Candidate | None) -> tuple[list[float] | str, str]:
        """(times in ms or why not, what was timed) for :meth:`_incumbent_ms`."""
        if incumbent is not None:
            return self._harness_ms(region, incumbent), "the accepted candidate"
        if not self.lowered:
            return self._harness_ms(region, original_candidate(region)), "the original region"
        measured = self._harness_ms(region, lowered_original_candidate(region))
        if not isinstance(measured, str):
            return measured, self.LOWERED
        return (self._harness_ms(region, original_candidate(region)),
                f"the original region op by op (Inductor's lowering of it alone: {measured})")

    LOWERED = "the original region as Inductor lowers it"

    def lowered_ms(self) -> dict[str, float]:
        """Per region signature, the median time (ms) of one occurrence as Inductor lowers the region
        alone, where this run measured it: what the region costs in what a user runs, against which the
        op-by-op profile (:mod:`kopt.agent.profile`) overstates the headroom of a fusible region."""
        return {key: statistics.median(times) for key, times in self._original_ms.items()
                if self._against.get(key) == self.LOWERED and times}

    @property
    def cost_model(self) -> bool:
        return getattr(self.clock, "name", "") == "cost-model"

    def check(self, occurrence: Any, candidate: Candidate, incumbent: Candidate | None = None) -> MicroResult:
        """Whether ``candidate`` is at least ``min_gain`` faster, alone, than what the region runs now
        (``incumbent``: the candidate already accepted for it, else the original region)."""
        original = self._incumbent_ms(occurrence, incumbent)
        if isinstance(original, str):
            return MicroResult(True, f"micro skipped: the incumbent could not be timed ({original})", None)
        if self.cost_model:
            timed = self._cost_model_ms(occurrence, candidate, int(candidate.content_hash[:8], 16))
        else:
            timed = self._harness_ms(occurrence.region, candidate)
            if isinstance(timed, str):
                return MicroResult(False, f"micro: {timed}", None)
        key = incumbent.content_hash if incumbent else occurrence.region.signature
        against = self._against.get(key, "the accepted candidate" if incumbent else "the original region")
        return self.judge(original, timed, against=against, signature=occurrence.region.signature)

    def judge(self, original: list[float], timed: list[float], *, against: str, signature: str = "",
              occurrences: int | None = None) -> MicroResult:
        """The bar and the Amdahl bound on two sets of times in ms (``original``: what runs now);
        ``occurrences`` per model call, else the count recorded for ``signature``."""
        base = statistics.median(original)
        ratios = [base / t for t in timed]
        median, low, high = bootstrap_median(ratios, self.resamples, self.seed)
        measurement = Measurement("ms", statistics.median(timed), base / high, base / low, len(timed), baseline=base)
        numbers = (f"{against} {base:.4g} ms -> {statistics.median(timed):.4g} ms "
                   f"({median:.3f}x, 95% CI [{low:.3f}, {high:.3f}])")
        if median - 1.0 < self.min_gain:
            return MicroResult(False, f"micro: not {self.min_gain:.0%} faster at the region level: {numbers}",
                               measurement)
        reachable, bound = self.reachable(signature, base - base / high, occurrences)
        if not reachable:
            return MicroResult(False, f"micro: cannot reach {self.min_gain:.0%} end to end: {bound} (Amdahl, "
                               f"at the CI's fast end); {numbers}", measurement)
        return MicroResult(True, f"micro: {numbers}" + (f"; {bound}" if bound else ""), measurement)
