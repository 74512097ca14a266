"""The agent's loop: profile → propose → verify → benchmark end to end → store, within a time budget.

Resumable: every evaluation lands in the knowledge base as it finishes, and a run starts from it:
what was accepted on this environment is the baseline again, and a candidate already evaluated here
(by content hash) is skipped. Stopping at any point (budget, Ctrl-C) loses at most the candidate in
flight.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from kopt.agent.bench import BenchConfig, E2EResult, WallClock, measure
from kopt.agent.candidate import Candidate
from kopt.agent.graphs import ProbedGraph, capture_graphs
from kopt.agent.kb import KnowledgeBase, Outcome, Status, current_environment
from kopt.agent.profile import Occurrence, Profile, find_occurrences, profile_graphs
from kopt.agent.verify import Verdict, VerifyConfig, verify
from kopt.progress import show_progress

log = logging.getLogger("kopt")
PROPOSERS = ("search", "llm", "all")


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """One candidate's evaluation in this run."""

    candidate: Candidate
    status: Status
    reason: str
    verdict: Verdict | None = None
    e2e: E2EResult | None = None


@dataclasses.dataclass
class OptimizeResult:
    """What a run did: the profile, every evaluation, the accepted set, and where things are."""

    profile: Profile
    evaluations: list[Evaluation]
    accepted: dict[str, Candidate]
    resumed: dict[str, Candidate]
    skipped: int
    kb_path: Path
    graphs: list[ProbedGraph]
    occurrences: list[Occurrence]
    clock: Any
    elapsed_s: float
    stopped: str = ""

    def table(self) -> str:
        from kopt.agent.report import candidate_table

        return candidate_table(self)

    def plot(self, path: str | Path) -> Path:
        from kopt.agent.report import region_plot

        return region_plot(self, Path(path))


def _proposals(proposer: str, occurrences: Sequence[Occurrence], profile: Profile, kb: KnowledgeBase, seed: int,
               llm: Any) -> Iterator[Candidate]:
    ranked = [r.region.signature for r in profile.regions]
    if proposer in ("search", "all"):
        from kopt.agent.propose.search import propose_all

        yield from propose_all(occurrences, ranked, seed=seed)
    if proposer in ("llm", "all"):
        from kopt.agent.propose.llm import LLMProposer

        llm = llm or LLMProposer.from_environment()
        yield from llm.propose_all(occurrences, profile, kb)


def _lesson(kb: KnowledgeBase, region: Any, evaluation: Evaluation, record: Any) -> None:
    params = ", ".join(f"{k}={v}" for k, v in evaluation.candidate.params) or evaluation.candidate.origin
    worked = evaluation.status is Status.ACCEPTED
    text = (f"{evaluation.candidate.kind.value} ({params}): "
            f"{'accepted' if worked else evaluation.status.value}: {evaluation.reason}")
    kb.record_lesson(region.class_key, Outcome.WORKED if worked else Outcome.FAILED, text[:500], evidence=[record],
                     region_signature=region.signature)


def _resume(kb: KnowledgeBase, signatures: Sequence[str], environment: Any) -> dict[str, Candidate]:
    accepted = {}
    for signature in signatures:
        best = kb.accepted(signature, environment)
        if best:
            accepted[signature] = Candidate.from_dict(best[0].candidate)
    return accepted


def evaluate(candidate: Candidate, region: Any, graphs: Sequence[ProbedGraph], accepted: Mapping[str, Candidate],
             clock: Any, verify_config: VerifyConfig, bench_config: BenchConfig) -> Evaluation:
    """Verify ``candidate`` in the sandbox, then measure it end to end on top of ``accepted``."""
    verdict = verify(region, candidate, verify_config)
    if not verdict.accepted:
        return Evaluation(candidate, Status.REJECTED, f"verifier: {verdict.reason}", verdict)
    try:
        result = measure(graphs, accepted, candidate, clock, bench_config)
    except Exception as error:  # noqa: BLE001 - an evaluation that fails is recorded, never fatal
        return Evaluation(candidate, Status.ERROR, f"end-to-end run failed: {type(error).__name__}: {error}", verdict)
    status = Status.ACCEPTED if result.accepted else Status.SLOWER
    return Evaluation(candidate, status, result.reason, verdict, result)


def optimize(model: torch.nn.Module, example_inputs: Sequence[Any] | Mapping[str, Any], *, budget_min: float = 20.0,
             proposer: str = "search", kb_path: str | Path | None = None, seed: int = 0, clock: Any = None,
             verify_config: VerifyConfig | None = None, bench_config: BenchConfig | None = None,
             model_name: str | None = None, max_candidates: int | None = None, llm: Any = None,
             progress: bool | None = None) -> OptimizeResult:
    """Find, prove and keep rewrites for ``model`` within ``budget_min`` minutes (module docstring).

    Args:
        model, example_inputs: the model and one call's inputs (a sequence or keyword mapping).
        budget_min: wall-clock budget; the candidate in flight when it runs out finishes.
        proposer: ``"search"`` (offline), ``"llm"`` (the anthropic SDK; recordings replay without a key),
            or ``"all"``.
        kb_path: the SQLite knowledge base (default ``~/.cache/kopt/kb.sqlite``).
        seed: makes proposals, bootstrap and the cost model's noise deterministic.
        clock: how end-to-end time is measured: a :class:`kopt.agent.bench.WallClock` by default;
            ``"cost-model"`` for :class:`kopt.agent.cost_model.CostModelClock` (CPU tests).
        max_candidates: stop after evaluating this many (skipped ones do not count).
    """
    if proposer not in PROPOSERS:
        raise ValueError(f"proposer must be one of {PROPOSERS}, got {proposer!r}")
    started = time.monotonic()
    deadline = started + budget_min * 60
    verify_config = verify_config or VerifyConfig(seed=seed)
    bench_config = bench_config or BenchConfig(seed=seed)
    with show_progress(progress), KnowledgeBase(kb_path) as kb:
        log.info("agent: capturing %s", model_name or type(model).__name__)
        graphs = capture_graphs(model, example_inputs)
        occurrences = [o for g in graphs for o in find_occurrences(g.graph_module, g.index, model=model_name)]
        log.info("agent: profiling %d region occurrences in %d graph(s)", len(occurrences), len(graphs))
        profile = profile_graphs(graphs, occurrences)
        if clock == "cost-model":
            from kopt.agent.cost_model import CostModelClock, modelled_profile

            clock = CostModelClock(graphs, occurrences, seed=seed)
            profile = modelled_profile(graphs, occurrences, clock.model)  # rank as the clock judges
        clock = clock or WallClock(graphs)
        environment = kb.record_environment(current_environment())
        regions = {o.region.signature: o.region for o in occurrences}
        for region in regions.values():
            kb.record_region(region, model=model_name)
        accepted = _resume(kb, list(regions), environment)
        resumed = dict(accepted)
        evaluations, skipped, stopped = [], 0, ""
        for candidate in _proposals(proposer, occurrences, profile, kb, seed, llm):
            if time.monotonic() > deadline:
                stopped = f"budget of {budget_min:g} min used"
                break
            if max_candidates is not None and len(evaluations) >= max_candidates:
                stopped = f"{max_candidates} candidates evaluated"
                break
            if candidate.region_signature not in regions:
                continue
            if kb.has_evaluated(candidate, environment):
                skipped += 1
                continue
            log.info("agent: candidate %d (%s %s) for region %s", len(evaluations) + 1, candidate.kind.value,
                     ", ".join(f"{k}={v}" for k, v in candidate.params[1:]), candidate.region_signature[:12])
            evaluation = evaluate(candidate, regions[candidate.region_signature], graphs, accepted, clock,
                                  verify_config, bench_config)
            e2e = evaluation.e2e.speedup if evaluation.e2e else None
            record = kb.record_candidate(candidate, status=evaluation.status, reason=evaluation.reason,
                                         verdict=evaluation.verdict, e2e=e2e, environment=environment)
            _lesson(kb, regions[candidate.region_signature], evaluation, record)
            if evaluation.status is Status.ACCEPTED:
                accepted[candidate.region_signature] = candidate
            log.info("agent: %s: %s", evaluation.status.value, evaluation.reason[:120])
            evaluations.append(evaluation)
    return OptimizeResult(profile, evaluations, accepted, resumed, skipped, Path(kb.path), graphs, occurrences, clock,
                          time.monotonic() - started, stopped)
