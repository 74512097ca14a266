"""End-to-end measurement on the whole model: interleaved A/B timing, a bootstrap CI, and output quality.

A candidate is kept only if the whole model gets faster, not just its region (a fused kernel can
win in isolation and lose in the model: layouts, launch order, caches). The rule (:func:`decide`):

* **speed**: ``samples`` interleaved pairs (A = the model with what is already accepted, B = the
  same plus the candidate; the order alternates ABBA so drift cancels); the speedup is A/B per pair;
  its median's 95% CI comes from ``resamples`` bootstrap resamples of the pairs. Accept only if the
  CI's low end is above 1 (the gain's CI excludes 0) and the median gain is at least ``min_gain``.
* **quality**: B's outputs, on fresh inputs, against the higher-precision reference of the same
  graphs (:func:`kopt.reference.run_reference`: float64 on the CPU), within the candidate's contract
  by :func:`kopt.verify.compare` (the eager graph's own error is the budget's base); with a clock
  that runs the whole model (:class:`kopt.agent.regional_clock.RegionalClock`), the model's output
  too, within the combined contract of everything the trial applies.

The model here is its captured graphs after the passes (:mod:`kopt.agent.graphs`), run in order;
a candidate set is applied to copies of them (:mod:`kopt.agent.apply`), which takes milliseconds,
so no whole-model recompile per candidate; a pipeline choice reruns its passes on the graph before
passes (:mod:`kopt.agent.pipeline_choice`), once per choice. Clocks: :class:`WallClock` (real time of
those graphs, synchronized on a GPU; run as FX op by op, or lowered by Inductor with
``lower="inductor"``, which is what GPU numbers must use) or, only when asked,
:class:`kopt.agent.cost_model.CostModelClock` (deterministic, for CPU tests).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

from kopt.agent.apply import apply_candidates
from kopt.agent.candidate import Candidate, CandidateKind
from kopt.agent.kb.records import Measurement
from kopt.passes.base import Contract


class Clock(Protocol):
    name: str

    def samples(self, chosen: Mapping[str, Candidate], count: int, stream: int) -> list[float]: ...


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    samples: int = 20  # pairs (each side gets this many)
    resamples: int = 2000
    min_gain: float = 0.01
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class E2EResult:
    accepted: bool
    reason: str
    speedup: Measurement
    quality: tuple[dict, ...]
    clock: str

    def to_dict(self) -> dict:
        return {"accepted": self.accepted, "reason": self.reason, "speedup": self.speedup.to_dict(),
                "quality": list(self.quality), "clock": self.clock}


def pipeline_choice_for(graph: Any, chosen: Mapping[str, Candidate]) -> Candidate | None:
    """The pipeline choice in ``chosen`` for ``graph`` (keyed by its signature before passes), if any."""
    if not any(c.kind is CandidateKind.PASS_CHOICE for c in chosen.values()):
        return None
    found = chosen.get(graph.signature)
    return found if found is not None and found.kind is CandidateKind.PASS_CHOICE else None


def lowering_patches(graph: Any, chosen: Mapping[str, Candidate]) -> dict[str, Any]:
    """The Inductor config patches ``graph``'s pipeline choice in ``chosen`` lowers it with (none: {})."""
    from kopt.agent.pipeline_choice import from_candidate

    choice = pipeline_choice_for(graph, chosen)
    return from_candidate(choice).inductor_patches if choice is not None else {}


def region_candidates(chosen: Mapping[str, Candidate]) -> dict[str, Candidate]:
    return {s: c for s, c in chosen.items() if c.kind is not CandidateKind.PASS_CHOICE}


def applied_one(graph: Any, chosen: Mapping[str, Candidate]) -> torch.fx.GraphModule:
    """A copy of one graph with ``chosen`` applied: its pipeline choice (the passes run again on the
    graph before passes), then the region candidates wherever their signatures occur."""
    from kopt.agent.pipeline_choice import from_candidate, run_choice, structural_copy

    choice = pipeline_choice_for(graph, chosen)
    if choice is not None:
        cache = graph.choice_graphs  # the passes run once per choice and graph
        if choice.content_hash not in cache:
            cache.clear()  # one at a time: each holds the constants its passes derived
            cache[choice.content_hash] = run_choice(graph.original, from_candidate(choice), graph.index)
        module = structural_copy(cache[choice.content_hash])
    else:
        module = structural_copy(graph.graph_module)  # shares the weights: applying rewrites only the graph
    regions = region_candidates(chosen)
    if regions:
        apply_candidates(module, regions)
    return module


def applied(graphs: Sequence[Any], chosen: Mapping[str, Candidate]) -> list[torch.fx.GraphModule]:
    """Copies of the graphs with ``chosen`` applied."""
    return [applied_one(graph, chosen) for graph in graphs]


def _run_all(modules: Sequence[Any], graphs: Sequence[Any]) -> list[Any]:
    with torch.no_grad():
        return [module(*graph.args) for module, graph in zip(modules, graphs, strict=True)]


@dataclasses.dataclass
class WallClock:
    """Real time per model call: the graphs with a candidate set applied, run in order.

    ``lower="eager"`` runs them as FX op by op; ``lower="inductor"`` lowers each with Inductor
    (:func:`kopt.lower.lower`), as ``kopt.compile`` does, so a GPU number is what a user gets (kopt's
    staging split is not applied here; it acts alike on A and B).

    ``replay`` (default: on a GPU with ``lower="inductor"``): each side's graphs are recorded once as
    one CUDA graph and every sample replays it, as ``kopt.compile`` replays the forward. Without it a
    rewrite that only removes launches shows a gain the user never sees (launch time is what replay
    removes), so an A/B on a GPU must replay. Recording is :class:`kopt.cuda_graphs.CudaGraphRunner`'s,
    as for a compiled graph (a warm-up on a side stream, the first replay checked against a plain call).
    A side whose graphs cannot be recorded (a host synchronisation, a CPU tensor) is timed as plain
    calls, as the user would run it, and :attr:`unreplayed` says why."""

    graphs: Sequence[Any]
    name: str = "wall"
    lower: str = "eager"
    replay: bool | None = None

    def __post_init__(self) -> None:
        if self.lower not in ("eager", "inductor"):
            raise ValueError(f"lower must be 'eager' or 'inductor', got {self.lower!r}")
        device = next((a.device for g in self.graphs for a in g.args if isinstance(a, torch.Tensor)), None)
        on_gpu = device is not None and device.type == "cuda"
        if self.replay is None:
            self.replay = on_gpu and self.lower == "inductor"
        elif self.replay and not on_gpu:
            raise ValueError("replay=True needs graphs whose inputs are on a CUDA device")
        if self.lower == "inductor" and self.name == "wall":
            self.name = "wall-inductor-graphs" if self.replay else "wall-inductor"
        self._built: dict[tuple[str, ...], list[Any]] = {}
        self._runners: dict[tuple[str, ...], Any] = {}  # key -> CudaGraphRunner of that side's graphs
        self.unreplayed: dict[tuple[str, ...], str] = {}  # key -> why that side runs as plain calls

    @staticmethod
    def _key(chosen: Mapping[str, Candidate]) -> tuple[str, ...]:
        return tuple(sorted(c.content_hash for c in chosen.values()))

    def _modules(self, chosen: Mapping[str, Candidate]) -> list[Any]:
        key = self._key(chosen)
        if key in self._built:
            self._built[key] = self._built.pop(key)  # most recently used last
        else:
            # An A/B needs two; older ones hold compiled code and derived constants. The least recently
            # used goes: the baseline A, timed first in every pair, stays built from one candidate to
            # the next (evicting the oldest instead lowered the whole model twice per candidate).
            while len(self._built) >= 2:
                evicted = next(iter(self._built))
                self._built.pop(evicted)
                self._runners.pop(evicted, None)  # its graph's memory pool goes with it
            modules: list[Any] = applied(self.graphs, chosen)
            if self.lower == "inductor":
                from kopt.config import Lowering
                from kopt.fx.symbolic import lowering_examples
                from kopt.lower import lower

                with torch.no_grad():  # an inference graph, as kopt's backend lowers it
                    modules = [lower(m, lowering_examples(m, list(g.args)), Lowering.INDUCTOR,
                                     lowering_patches(g, chosen))
                               for m, g in zip(modules, self.graphs, strict=True)]
            self._built[key] = modules
            for _ in range(2):  # warm-up: kernels compile at their first launch, lazy setup at the second
                _run_all(self._built[key], self.graphs)
            if self.replay:
                self._runners[key] = self._record(key, modules)
        return self._built[key]

    def _record(self, key: tuple[str, ...], modules: Sequence[Any]) -> Any:
        """A runner replaying ``modules`` run in order on the graphs' fixed inputs, recorded by its first call."""
        from kopt.cuda_graphs import CudaGraphRunner

        runner = CudaGraphRunner(lambda: _run_all(modules, self.graphs), warmup=0, clone_outputs=False)
        runner()
        if runner.stats.disabled is not None:  # it runs the graphs as plain calls from now on
            self.unreplayed[key] = runner.stats.disabled
            logging.getLogger("kopt").warning("agent: timing one side as plain calls: %s", runner.stats.disabled)
        return runner

    def time_once(self, chosen: Mapping[str, Candidate]) -> float:
        modules = self._modules(chosen)
        runner = self._runners.get(self._key(chosen))
        device = next((a.device for g in self.graphs for a in g.args if isinstance(a, torch.Tensor)), None)
        sync = torch.cuda.synchronize if device is not None and device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        if runner is not None:
            runner()
        else:
            _run_all(modules, self.graphs)
        sync()
        return time.perf_counter() - start

    def samples(self, chosen: Mapping[str, Candidate], count: int, stream: int) -> list[float]:
        return [self.time_once(chosen) for _ in range(count)]


def interleaved(clock: Clock, baseline: Mapping[str, Candidate], candidate: Mapping[str, Candidate],
                count: int) -> tuple[list[float], list[float]]:
    """``count`` A and B samples, one at a time in ABBA order (drift hits both sides alike)."""
    a, b = [], []
    for i in range(count):
        order = ((a, baseline, 0), (b, candidate, 1)) if i % 2 == 0 else ((b, candidate, 1), (a, baseline, 0))
        for side, chosen, stream in order:
            side.extend(clock.samples(chosen, 1, stream * 100_003 + i))
    return a, b


def bootstrap_median(values: Sequence[float], resamples: int, seed: int) -> tuple[float, float, float]:
    """Median and its bootstrap 95% CI (percentile method)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return statistics.median(values), medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def holds_sentinels(value: torch.Tensor) -> bool:
    """Whether a floating tensor holds infinities, NaN or values within a factor 2 of its dtype's
    largest: an additive attention mask (``finfo.min`` where a key is hidden) or another sentinel.
    Such a tensor is structure, not data: noise with its mean and spread would be NaN (the spread
    overflows) or would hide other keys, so the graph would be checked on a computation it never runs.
    Not for 8-bit floats, whose scaled values reach their largest by design (a row quantized to FP8
    has 448 in it) and which hold no mask."""
    if not value.is_floating_point() or value.numel() == 0:
        return False
    values = value.detach().float()
    if (~torch.isfinite(values)).any():
        return True
    info = torch.finfo(value.dtype)
    return info.bits > 8 and bool(values.abs().max() >= info.max / 2)


def fresh_args(args: Sequence[Any], seed: int) -> list[Any]:
    """New values for the floating per-call inputs (same shape, mean and spread); others unchanged,
    masks and other tensors of sentinels too (:func:`holds_sentinels`)."""
    generator = torch.Generator().manual_seed(seed)
    fresh = []
    for value in args:
        if (isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel() > 1
                and not holds_sentinels(value)):
            noise = torch.randn(value.shape, generator=generator, dtype=torch.float32).to(value.device)
            spread = value.float().std() if value.numel() > 1 else value.float().abs()
            fresh.append((value.float().mean() + noise * spread).to(value.dtype))
        else:
            fresh.append(value)
    return fresh


def quality(graphs: Sequence[Any], chosen: Mapping[str, Candidate], contract: Contract, seed: int,
            lower: str = "eager") -> list[dict]:
    """Outputs of the graphs with ``chosen`` applied vs the higher-precision reference, on fresh inputs.
    A graph under a pipeline choice is judged against its graph before passes, within the choice's
    contract combined with ``contract`` (:mod:`kopt.agent.pipeline_choice`); with ``lower="inductor"``,
    a choice that patches the lowering is also judged as lowered with its patches."""
    from kopt.agent.pipeline_choice import from_candidate, lowered_output_checks, output_checks

    checks = []
    for graph in graphs:
        module = applied_one(graph, chosen)
        args = fresh_args(graph.args, seed)
        choice = pipeline_choice_for(graph, chosen)
        if choice is not None:
            budget = from_candidate(choice).contract
            budget = budget if choice.contract == contract else budget.combine(contract)
            checks.extend(output_checks(graph.original, module, args, budget, graph.index))
            patches = from_candidate(choice).inductor_patches
            if patches and lower == "inductor":
                checks.extend(lowered_output_checks(graph.original, module, args, budget, patches, graph.index))
        else:
            checks.extend(output_checks(graph.graph_module, module, args, contract, graph.index))
    return checks


def measure(graphs: Sequence[Any], baseline: Mapping[str, Candidate], candidate: Candidate, clock: Clock,
            config: BenchConfig | None = None) -> E2EResult:
    """Is the model with ``baseline`` plus ``candidate`` faster than with ``baseline`` alone, and still
    correct? (module docstring)."""
    config = config or BenchConfig()
    trial = {**baseline, candidate.region_signature: candidate}
    checks = quality(graphs, trial, candidate.contract, config.seed, lower=getattr(clock, "lower", "eager"))
    model_checks = getattr(clock, "model_checks", None)
    if model_checks is not None:  # the whole model's output too, under everything the trial applies
        contract = functools.reduce(Contract.combine, (c.contract for c in trial.values()), Contract.exact())
        checks += model_checks(trial, contract, config.seed)
    a, b = interleaved(clock, baseline, trial, config.samples)
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    median, low, high = bootstrap_median(ratios, config.resamples, config.seed)
    incumbent = baseline.get(candidate.region_signature)  # what the speedup is over, in this region
    speedup = Measurement("speedup", median, low, high, len(ratios), baseline=statistics.median(a),
                          against=incumbent.content_hash if incumbent is not None else None)
    accepted, reason = decide(speedup, checks, config.min_gain)
    return E2EResult(accepted, reason, speedup, tuple(checks), clock.name)


def baseline_problem(clock: Clock, accepted: Mapping[str, Candidate], seed: int) -> str | None:
    """Why the model as the baseline runs it (``passes="auto"`` with ``accepted``) is already outside
    the contract of those passes on its output, or None; None too for a clock without model checks.
    Every candidate's model check measures against the same reference, so a compile that is wrong
    by itself would have each candidate blamed for its error, and the run would teach nothing."""
    model_checks = getattr(clock, "model_checks", None)
    if model_checks is None:
        return None
    from kopt.passes.pipeline import default_pipeline

    contracts = [p.contract for p in default_pipeline()] + [c.contract for c in accepted.values()]
    bad = [c for c in model_checks(dict(accepted), functools.reduce(Contract.combine, contracts, Contract.exact()),
                                   seed) if not c["ok"]]
    return f"{bad[0]['verdict']} (model output {bad[0]['output']})" if bad else None


def decide(speedup: Measurement, checks: Sequence[dict], min_gain: float) -> tuple[bool, str]:
    bad = [c for c in checks if not c["ok"]]
    numbers = f"speedup {speedup.median:.4f}x, 95% CI [{speedup.ci_low:.4f}, {speedup.ci_high:.4f}]"
    if bad:
        return False, f"model output outside the contract: {bad[0]['verdict']} (graph {bad[0]['graph']})"
    if speedup.ci_high < 1.0:
        return False, f"no end-to-end win: slower, the whole CI lies below no change ({numbers})"
    if speedup.ci_low <= 1.0:
        return False, f"no end-to-end win: the CI includes no gain ({numbers})"
    if speedup.median - 1.0 < min_gain:
        return False, f"end-to-end gain below {min_gain:.0%} ({numbers})"
    return True, f"end-to-end win: {numbers}; output within the contract"
