"""The agent's loop: profile → propose → verify → benchmark end to end → store, within a time budget.

Two kinds of candidates: a region's replacement (verified in the sandbox against the region, then
micro-timed alone: :mod:`kopt.agent.micro` stops one not 1% faster before the end-to-end A/B) and a
pipeline choice for a whole graph (:mod:`kopt.agent.pipeline_choice`; its check is the model output
against the higher-precision reference, inside the end-to-end measurement). Search proposals are
taken breadth first, every family once before any twice (:mod:`kopt.agent.propose.breadth`), and
then ordered by what the knowledge base learned on other models (:mod:`kopt.agent.propose.warm`).

Parallel (:mod:`kopt.agent.pool`): with ``workers`` beyond the one that shares the timing device, a
pool of workers verifies the next region candidates while the loop times the current one (verdicts
do not depend on what was accepted, so verifying ahead is valid); timing stays serial here.

Resumable: every evaluation lands in the knowledge base as it finishes, and a run starts from it:
what was accepted on this environment is the baseline again, and a candidate already evaluated here
(by content hash) is skipped. Stopping at any point (budget, Ctrl-C) loses at most the candidate in
flight.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from kopt.agent.bench import BenchConfig, E2EResult, WallClock, baseline_problem, measure
from kopt.agent.candidate import Candidate, CandidateKind
from kopt.agent.fp8_dominance import settled_by, settled_reason
from kopt.agent.fp8_groups import is_narrowed, narrowing_unwanted
from kopt.agent.graphs import ProbedGraph, capture_graphs, lone_gemm, without_minor_gemms
from kopt.agent.kb import KnowledgeBase, Outcome, Status, current_environment
from kopt.agent.kb.records import Measurement
from kopt.agent.micro import MicroBench, timing_config
from kopt.agent.pipeline_choice import rebased, same_pipeline
from kopt.agent.pool import AUTO, Ahead, Lookahead, VerifyEvent, VerifyJob, VerifyOutcome, make_executor, timing_gpu
from kopt.agent.pool.job import travels
from kopt.agent.profile import Occurrence, Profile, find_occurrences, profile_graphs
from kopt.agent.sdpa_micro import check_attention_choice
from kopt.agent.tuning_cost import tuning_seconds
from kopt.agent.unchanged import changes_nothing
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
    verdict: Verdict | dict | None = None
    e2e: E2EResult | None = None
    micro: Measurement | None = None
    seconds: float = 0.0  # wall time this evaluation took in the loop (verification, micro, end to end)


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
    pool: str = "inline"
    verified_ahead: list[VerifyEvent] = dataclasses.field(default_factory=list)
    deferred: list[Candidate] = dataclasses.field(default_factory=list)  # not started: would outlast the budget
    lowered_s: dict[str, float] = dataclasses.field(default_factory=dict)  # per region: one occurrence, Inductor

    def table(self) -> str:
        from kopt.agent.report import candidate_table

        return candidate_table(self)

    def plot(self, path: str | Path) -> Path:
        from kopt.agent.report import region_plot

        return region_plot(self, Path(path))


def _proposal_batches(proposer: str, occurrences: Sequence[Occurrence], profile: Profile, kb: KnowledgeBase,
                      seed: int, llm: Any, graphs: Sequence[ProbedGraph] = (),
                      class_keys: Mapping[str, str] | None = None, device: str = "cpu", fp8: Any = None,
                      pipelines: bool = True, min_gain: float = 0.01,
                      follow_up: Callable[[], list[Occurrence]] | None = None) -> Iterator[list[Candidate]]:
    """The proposals in batches: the next one is asked for only once the loop took every candidate
    before it, so a look-ahead never makes a proposer read the KB earlier (:mod:`kopt.agent.pool.lookahead`).
    ``follow_up``: the regions that appeared since (:func:`regions_under_accepted`); each later batch
    holds the search proposals for them, until none appear."""
    ranked = [r.region.signature for r in profile.regions]
    if proposer in ("search", "all"):
        from kopt.agent.fp8_dominance import lesser_rounding_first
        from kopt.agent.fp8_groups import narrowed_after_whole
        from kopt.agent.propose.breadth import breadth_first, fp8_leads, small_regions
        from kopt.agent.propose.pipeline import propose_pipelines
        from kopt.agent.propose.search import propose_all
        from kopt.agent.propose.warm import warm_order

        found = list(propose_all(occurrences, ranked, seed=seed))
        if pipelines:
            found += list(propose_pipelines(graphs, device=device, fp8=fp8))
        small = small_regions(profile, min_gain)
        ordered = warm_order(breadth_first(found, small, fp8_leads(found, profile)), kb, class_keys or {})
        yield narrowed_after_whole(lesser_rounding_first(list(ordered)))
        while follow_up is not None:
            fresh = follow_up()
            if not fresh:
                break
            unranked = list(dict.fromkeys(o.region.signature for o in fresh))  # not profiled: in graph order
            yield list(warm_order(breadth_first(list(propose_all(fresh, unranked, seed=seed))), kb, class_keys or {}))
    if proposer in ("llm", "all"):
        from kopt.agent.propose.llm import LLMProposer

        llm = llm or LLMProposer.from_environment()
        if hasattr(llm, "propose_batches"):
            yield from llm.propose_batches(occurrences, profile, kb)
        else:  # a proposer that only streams: one candidate at a time, nothing asked for early
            yield from ([candidate] for candidate in llm.propose_all(occurrences, profile, kb))


def _lesson(kb: KnowledgeBase, region: Any, evaluation: Evaluation, record: Any) -> None:
    params = ", ".join(f"{k}={v}" for k, v in evaluation.candidate.params) or evaluation.candidate.origin
    worked = evaluation.status is Status.ACCEPTED
    text = (f"{evaluation.candidate.kind.value} ({params}): "
            f"{'accepted' if worked else evaluation.status.value}: {evaluation.reason}")
    kb.record_lesson(region.class_key, Outcome.WORKED if worked else Outcome.FAILED, text[:500], evidence=[record],
                     region_signature=region.signature)


def _resume(kb: KnowledgeBase, signatures: Sequence[str], environment: Any) -> dict[str, Candidate]:
    """What a resumed run starts on top of, per signature: the best accepted record (a graph's pipeline
    choices by their chain's speedup against the base, :func:`kopt.agent.pipeline_choice.best_accepted`)."""
    from kopt.agent.pipeline_choice import best_accepted

    accepted = {}
    for signature in signatures:
        found = kb.accepted(signature, environment)
        choices = [r for r in found if r.candidate["kind"] == CandidateKind.PASS_CHOICE.value]
        best = best_accepted(choices) if choices else (found[0] if found else None)
        if best is not None:
            accepted[signature] = Candidate.from_dict(best.candidate)
    return accepted


def default_between_blocks(model: torch.nn.Module, regional: bool, fp8: bool) -> str:
    """What a regional run compiles between the blocks when the caller does not say: ``"outer"`` for a
    model whose blocks are run by an inner module (a transformers LLM: its LM head, and Gemma 2's logit
    cap, become one graph with its choices; Gemma-2-9B prefill 78.7 against 79.8 ms with the code
    eager, H100, ``dit-full-gemma2-s28e``), else ``"linears"`` with FP8 (a lone linear compiled in bf16
    runs the GEMM it ran eagerly; in FP8 it can be faster), else ``"eager"``."""
    if not regional:
        return "eager"
    from kopt.between_blocks import has_code_around
    from kopt.regional import repeated_blocks

    blocks = repeated_blocks(model)
    if blocks and has_code_around(model, blocks):
        return "outer"
    return "linears" if fp8 else "eager"


def _evaluate_or_error(candidate: Candidate, *args: Any) -> Evaluation:
    """:func:`evaluate`, with an exception it raises recorded as that candidate's error (traceback in the
    log) instead of ending the run: one candidate's failure must not cost the rest of a run's budget.
    ``Status.ERROR`` teaches nothing of the candidate and is tried again by the next run."""
    try:
        return evaluate(candidate, *args)
    except Exception as error:  # noqa: BLE001 - kept as the record's reason; KeyboardInterrupt still stops
        log.warning("agent: the evaluation raised; the run goes on", exc_info=True)
        first = (str(error).splitlines() or [""])[0][:300]
        return Evaluation(candidate, Status.ERROR, f"the evaluation raised {type(error).__name__}: {first}")


def evaluate(candidate: Candidate, region: Any, graphs: Sequence[ProbedGraph], accepted: Mapping[str, Candidate],
             clock: Any, verify_config: VerifyConfig, bench_config: BenchConfig, micro: Any = None,
             occurrence: Occurrence | None = None, verified: VerifyOutcome | None = None) -> Evaluation:
    """Verify ``candidate`` in the sandbox (a region candidate), time it alone (``micro``), then
    measure it end to end on top of ``accepted``; a pipeline choice's check is the end-to-end one.
    ``verified``: the pool's verification of it, done ahead (the sandbox is not run again)."""
    verdict, micro_result = None, None
    keep_only = getattr(clock, "keep_only", None)
    if keep_only is not None:  # sides of candidates already judged hold memory the next steps need
        keep_only(accepted)
    if candidate.kind is not CandidateKind.PASS_CHOICE:
        nothing = changes_nothing(graphs, accepted, candidate)
        if nothing:  # the region is gone under what was accepted: its candidate cannot act
            return Evaluation(candidate, Status.SLOWER, nothing,
                              {"kind": "unchanged-graph", "accepted": None, "checks": [], "reason": nothing})
        if verified is not None and verified.verdict is None:
            return Evaluation(candidate, Status.ERROR, f"verification failed in the worker: {verified.error}")
        if verified is None:
            log.info("agent:   verifying in the sandbox (trials on fresh inputs against the region)")
        verdict = verified.verdict if verified is not None else verify(region, candidate, verify_config)
        log.info("agent:   verifier: %s in %.1f s, %d trial(s)", "passed" if verdict.accepted else "failed",
                 verdict.elapsed_s, verdict.trials)
        if not verdict.accepted:
            status = Status.ERROR if verdict.inconclusive else Status.REJECTED
            return Evaluation(candidate, status, f"verifier: {verdict.reason}", verdict)
        if micro is not None and occurrence is not None:
            incumbent = accepted.get(candidate.region_signature)
            log.info("agent:   timing the region alone against %s (micro)",
                     "the kept candidate" if incumbent is not None else "Inductor's lowering of it")
            began = time.monotonic()
            micro_result = micro.check(occurrence, candidate, incumbent)
            log.info("agent:   micro: %s in %.1f s", "passed" if micro_result.passed else "not passed",
                     time.monotonic() - began)
            if not micro_result.passed:
                return Evaluation(candidate, Status.SLOWER, micro_result.reason, verdict,
                                  micro=micro_result.measurement)
    if candidate.kind is CandidateKind.PASS_CHOICE:
        nothing = changes_nothing(graphs, accepted, candidate)
        if nothing:  # the baseline's own graph: correct by construction, and no faster
            return Evaluation(candidate, Status.SLOWER, nothing,
                              {"kind": "unchanged-graph", "accepted": True, "checks": [], "reason": nothing})
        if micro is not None:
            attention = check_attention_choice(candidate, graphs, accepted, micro)
            if attention is not None and not attention.passed:  # no measurement: the backend cannot run it
                status = (Status.SLOWER if attention.measurement else
                          Status.ERROR if attention.inconclusive else Status.REJECTED)
                unchecked = {"kind": "attention-micro", "accepted": None, "checks": [],
                             "reason": "settled at the micro stage, before the model-output check"}
                return Evaluation(candidate, status, attention.reason, unchecked, micro=attention.measurement)
            micro_result = attention
    try:
        result = measure(graphs, accepted, candidate, clock, bench_config)
    except Exception as error:  # noqa: BLE001 - an evaluation that fails is recorded, never fatal
        return Evaluation(candidate, Status.ERROR, f"end-to-end run failed: {type(error).__name__}: {error}", verdict)
    if verdict is None:  # a pipeline choice: the whole-model output check is its verification
        verdict = {"kind": "whole-model", "accepted": all(q["ok"] for q in result.quality),
                   "checks": list(result.quality)}
    status = Status.ACCEPTED if result.accepted else Status.SLOWER
    measured = micro_result.measurement if micro_result else None
    return Evaluation(candidate, status, result.reason, verdict, result, micro=measured)


def regions_under_accepted(graphs: Sequence[ProbedGraph], accepted: Mapping[str, Candidate],
                           known: Mapping[str, Any], model: str | None = None) -> list[Occurrence]:
    """Occurrences of regions that are not in ``known`` in the graphs as the accepted pipeline choices
    rewrite them: an FP8 pipeline replaces the bf16 regions the first proposals were made for with
    regions of its own (quantize epilogues, the code around FP8 GEMMs), which deserve proposals too.
    Why a candidate for one is valid where it is applied: it is verified against that region, and it
    replaces only occurrences of that signature (:mod:`kopt.agent.apply`), under that choice."""
    from kopt.agent.bench import applied_one, pipeline_choice_for

    fresh = []
    for graph in graphs:
        if pipeline_choice_for(graph, accepted) is None:
            continue
        module = applied_one(graph, {s: c for s, c in accepted.items() if c.kind is CandidateKind.PASS_CHOICE})
        fresh += [o for o in find_occurrences(module, graph.index, model=model) if o.region.signature not in known]
    return fresh


def wants_regional(model: Any, regional: bool | None, lower: str, clock: Any) -> bool:
    """Whether :func:`optimize` works regionally (its ``regional`` argument); True on a model without
    repeated blocks raises, saying so."""
    from kopt.regional import repeated_blocks

    blocks = isinstance(model, torch.nn.Module) and bool(repeated_blocks(model))
    if regional is None:
        return blocks and lower == "inductor" and clock is None
    if regional and not blocks:
        raise ValueError(f"regional=True: {type(model).__name__} declares no _repeated_blocks and has no "
                         "nn.ModuleList of blocks; optimize it whole (regional=False)")
    return regional


def overrun(evaluations: Sequence[Any], deadline: float, now: float, kind: CandidateKind | None = None,
            recorded: Sequence[float] = ()) -> float | None:
    """The seconds the next evaluation takes when fewer are left before ``deadline``, else None.

    Without ``kind``: the median of the end-to-end evaluations so far — they dominate a run (a
    whole-model A/B against seconds for a candidate settled before it), and a budget that is the GPU
    time one lease gives must not be overrun by the candidate started last. With ``kind``: the median
    of this run's evaluations of that kind, however they ended, those settled in under a second (a
    region gone under the kept choices: nothing ran) left out — a generated kernel's verification and
    micro timing take 60-170 s on a full-size model where a pipeline choice settles in 10-30 s, so the
    overall median lets one start with half a minute left; the cheaper kinds may still fit. Until this
    run has timed a candidate of the kind, ``recorded`` (the knowledge base's times for the kind on this
    machine, :meth:`kopt.agent.kb.store.KnowledgeBase.evaluation_seconds`) stands in: a resumed run's
    first generated kernel costs what the earlier runs' did."""
    if kind is None:
        seconds = [e.seconds for e in evaluations if e.e2e is not None and e.seconds]
    else:
        seconds = ([e.seconds for e in evaluations if e.candidate.kind is kind and e.seconds and e.seconds >= 1.0]
                   or [s for s in recorded if s >= 1.0])
    if not seconds:
        return None
    expected = statistics.median(seconds)
    return expected if now + expected > deadline else None


def optimize(model: torch.nn.Module, example_inputs: Sequence[Any] | Mapping[str, Any], *, budget_min: float = 20.0,
             proposer: str = "search", kb_path: str | Path | None = None, seed: int = 0, clock: Any = None,
             verify_config: VerifyConfig | None = None, bench_config: BenchConfig | None = None,
             model_name: str | None = None, max_candidates: int | None = None, llm: Any = None,
             progress: bool | None = None, micro: bool = True, lower: str = "eager", fp8: Any = None,
             pipelines: bool = True, workers: int | str = AUTO, executor: str = "local",
             regional: bool | None = None, between_blocks: str | None = None,
             on_evaluation: Callable[[Evaluation], None] | None = None) -> OptimizeResult:
    """Find, prove and keep rewrites for ``model`` within ``budget_min`` minutes (module docstring).

    Args:
        model, example_inputs: the model and one call's inputs (a sequence or keyword mapping).
        budget_min: wall-clock budget. No candidate starts once what is left is shorter than the median
            end-to-end evaluation so far (:func:`overrun`); the candidate in flight finishes.
        proposer: ``"search"`` (offline), ``"llm"`` (the anthropic SDK; recordings replay without a key),
            or ``"all"``.
        kb_path: the SQLite knowledge base (default ``~/.cache/kopt/kb.sqlite``).
        seed: makes proposals, bootstrap and the cost model's noise deterministic.
        clock: how end-to-end time is measured: a :class:`kopt.agent.bench.WallClock` by default;
            ``"cost-model"`` for :class:`kopt.agent.cost_model.CostModelClock` (CPU tests).
        max_candidates: stop after evaluating this many (skipped ones do not count).
        micro: time region candidates alone first and stop those not 1% faster (:mod:`kopt.agent.micro`).
        lower: how the default :class:`~kopt.agent.bench.WallClock` runs the graphs: ``"eager"`` (FX op
            by op) or ``"inductor"`` (lowered as ``kopt.compile`` does: use this on a GPU).
        fp8: an :class:`kopt.fp8.config.Fp8Config`: also propose the FP8 pipeline per granularity.
        pipelines: propose pipeline choices (opt-in passes, left-out passes, attention backends).
        workers: verification workers (:mod:`kopt.agent.pool`): ``"auto"`` is one per visible GPU, the
            timing GPU left out when there are two or more (one GPU, or timing on the CPU: one worker,
            verifying inline as before); a count asks for that many (on the CPU, or over the GPUs).
        executor: ``"local"`` (worker processes on this machine driving the sandbox) or ``"ray"`` (Ray tasks;
            ``pip install 'kopt[ray]'``; a running Ray or ``RAY_ADDRESS`` is used, else a local one).
        regional: work on one graph per repeated block class and time the whole forward compiled as
            ``kopt.compile(regional=True)`` compiles it (:class:`kopt.agent.regional_clock.RegionalClock`):
            a candidate costs the compile of a few blocks, not of the model. What is accepted is
            keyed by the block graphs, so ``kopt.compile(..., regional=True)`` is what applies it.
            None (default): when ``lower="inductor"``, no clock is given and the model has repeated
            blocks (:func:`kopt.regional.repeated_blocks`); False: capture and time the whole model.
        between_blocks: with ``regional``, as ``kopt.compile``'s: ``"linears"`` makes each large linear
            between the blocks a graph of its own (an LLM's LM head), which gets choices of its own (FP8
            for it alone, judged on the model's output like every choice); apply what is accepted there
            with ``kopt.compile(..., regional=True, between_blocks="linears")``. None (default):
            :func:`default_between_blocks`.
        on_evaluation: called with each evaluation as soon as it is recorded (a caller that writes
            results as they come keeps them if the run is killed).

    A choice that tunes GEMMs is not started when its expected tuning time
    (:func:`kopt.agent.tuning_cost.tuning_seconds`) exceeds the time left, nor a candidate of a kind
    whose evaluations in this run took longer than is left (:func:`overrun` with ``kind``); each is listed in
    ``OptimizeResult.deferred`` and stays unevaluated for a run with more time.
    """
    if proposer not in PROPOSERS:
        raise ValueError(f"proposer must be one of {PROPOSERS}, got {proposer!r}")
    started = time.monotonic()
    deadline = started + budget_min * 60
    verify_config = verify_config or VerifyConfig(seed=seed)
    bench_config = bench_config or BenchConfig(seed=seed)
    regional = wants_regional(model, regional, lower, clock)
    if between_blocks is None:
        between_blocks = default_between_blocks(model, regional, fp8 is not None)
    elif between_blocks != "eager" and not regional:
        raise ValueError(f"between_blocks={between_blocks!r} is for regional runs (a whole-model capture "
                         "holds the code between blocks already)")
    with show_progress(progress), KnowledgeBase(kb_path) as kb:
        log.info("agent: capturing %s%s", model_name or type(model).__name__,
                 " one graph per repeated block class" if regional else "")
        graphs = capture_graphs(model, example_inputs, regional=regional, between_blocks=between_blocks)
        if between_blocks == "linears":  # a lone GEMM under 1 % of the work cannot give a 1 % win
            graphs = without_minor_gemms(graphs, bench_config.min_gain)
            if not any(lone_gemm(g) for g in graphs):  # none left: the sides need not compile them
                between_blocks = "eager"
        occurrences = [o for g in graphs for o in find_occurrences(g.graph_module, g.index, model=model_name)]
        log.info("agent: profiling %d region occurrences in %d graph(s)", len(occurrences), len(graphs))
        profile = profile_graphs(graphs, occurrences)
        if clock == "cost-model":
            from kopt.agent.cost_model import CostModelClock, modelled_profile

            clock = CostModelClock(graphs, occurrences, seed=seed)
            profile = modelled_profile(graphs, occurrences, clock.model)  # rank as the clock judges
        if clock is None and regional:
            from kopt.agent.regional_clock import RegionalClock

            clock = RegionalClock(model, example_inputs, lower=lower, between_blocks=between_blocks)
        clock = clock or WallClock(graphs, lower=lower)
        environment = kb.record_environment(current_environment())
        regions = {o.region.signature: o.region for o in occurrences}
        first = {}
        for occurrence in occurrences:
            first.setdefault(occurrence.region.signature, occurrence)
        if pipelines and proposer in ("search", "all"):
            from kopt.agent.pipeline_choice import graph_region

            regions.update({g.signature: graph_region(g.original, model=model_name) for g in graphs})
        for region in regions.values():
            kb.record_region(region, model=model_name)
        class_keys = {signature: region.class_key for signature, region in regions.items()}
        timing_device = next((a.device for g in graphs for a in g.args if isinstance(a, torch.Tensor)),
                             torch.device("cpu"))
        device = timing_device.type
        timing = timing_config(timing_device)
        if timing.device != "cpu" and verify_config.device == "cpu":  # generated kernels verify compiled
            verify_config = dataclasses.replace(verify_config, device=timing.device)
        counts: dict[str, int] = {}
        calls = {g.index: g.calls for g in graphs}
        for occurrence in occurrences:  # per model call: a block class's graph runs once per block
            signature = occurrence.region.signature
            counts[signature] = counts.get(signature, 0) + calls[occurrence.graph_index]
        bench = MicroBench(clock, verify_config, min_gain=bench_config.min_gain, seed=seed,
                           timing=timing, occurrences=counts) if micro else None
        accepted = _resume(kb, list(regions), environment)
        resumed = dict(accepted)
        recorded_seconds = kb.evaluation_seconds(environment)  # per kind, for overrun() before one is timed
        evaluations, skipped, stopped, deferred = [], 0, "", []
        def follow_up() -> list[Occurrence]:
            """Register the regions the accepted choices made (:func:`regions_under_accepted`)."""
            fresh = regions_under_accepted(graphs, accepted, regions, model_name)
            for occurrence in fresh:
                signature = occurrence.region.signature
                if signature not in regions:
                    regions[signature] = occurrence.region
                    class_keys[signature] = occurrence.region.class_key
                    kb.record_region(occurrence.region, model=model_name)
                    first[signature] = occurrence
                if bench is not None:  # per model call, for the micro step's Amdahl bound
                    bench.occurrences[signature] = bench.occurrences.get(signature, 0) + calls[occurrence.graph_index]
            if fresh:
                log.info("agent: %d new region(s) in the graphs under the accepted choices",
                         len({o.region.signature for o in fresh}))
            return fresh

        batches = _proposal_batches(proposer, occurrences, profile, kb, seed, llm, graphs, class_keys, device, fp8,
                                    pipelines, bench_config.min_gain, follow_up if pipelines else None)

        def job_for(candidate: Candidate) -> VerifyJob | None:
            """The sandbox verification the loop will want for ``candidate`` (it skips the others)."""
            if (candidate.kind is CandidateKind.PASS_CHOICE or candidate.region_signature not in regions
                    or kb.has_evaluated(candidate, environment) or not travels(regions[candidate.region_signature])):
                return None  # the loop skips it, or verifies it inline
            return VerifyJob.of(regions[candidate.region_signature], candidate, verify_config)

        pool = make_executor(executor, workers, timing_gpu(timing_device.type, timing_device.index))
        pool_text = f"{len(pool.slots)} {pool.name} worker(s)" if pool else "inline"
        if pool:
            log.info("agent: verifying ahead of the timing on %s (%s)", pool_text, pool.placement)
            if pool.shares_timing_device:
                log.warning("agent: verification workers share the timing device (%s): measured times may be "
                            "perturbed (the cost-model clock is not)", timing_device)
        stream = (Lookahead(batches, job_for, pool, window=2 * len(pool.slots)) if pool
                  else (Ahead(c) for batch in batches for c in batch))
        try:
            problem = baseline_problem(clock, accepted, seed)
            if problem:  # nothing below could be judged fairly: stop with the compile's own error
                stopped = (f"the baseline (passes=\"auto\"{' with the kept choices' if accepted else ''}) is outside "
                           f"its contract on the model's output: {problem}; every candidate would be blamed for it")
                log.error("agent: %s", stopped)
            for ahead in () if problem else stream:
                candidate = ahead.candidate
                if time.monotonic() > deadline:
                    stopped = f"budget of {budget_min:g} min used"
                    break
                expected = overrun(evaluations, deadline, time.monotonic())
                if expected is not None:
                    stopped = (f"budget of {budget_min:g} min: {deadline - time.monotonic():.0f} s left, "
                               f"an end-to-end evaluation takes about {expected:.0f} s")
                    break
                if max_candidates is not None and len(evaluations) >= max_candidates:
                    stopped = f"{max_candidates} candidates evaluated"
                    break
                if candidate.region_signature not in regions:
                    continue
                if candidate.kind is CandidateKind.PASS_CHOICE:
                    if kb.has_evaluated(candidate, environment):
                        skipped += 1
                        continue
                    kept = accepted.get(candidate.region_signature)
                    candidate = rebased(candidate, kept)
                    if kept is not None and same_pipeline(candidate, kept):
                        continue  # the change is already part of what was kept for this graph
                if kb.has_evaluated(candidate, environment):
                    skipped += 1
                    continue
                unwanted = is_narrowed(candidate) and narrowing_unwanted(
                    candidate, kb.latest(signature=candidate.region_signature, environment=environment))
                if unwanted:  # kopt.agent.fp8_groups: FP8 on every linear of the graph has not missed yet
                    log.info("agent: not evaluated (%s): %s", dict(candidate.params).get("change"), unwanted)
                    continue
                tuning = tuning_seconds(candidate, graphs)
                if tuning and time.monotonic() + tuning > deadline:
                    log.info("agent: not started (%s): its GEMM tuning takes about %.0f s, %.0f s are left",
                             dict(candidate.params).get("change", candidate.kind.value), tuning,
                             deadline - time.monotonic())
                    deferred.append(candidate)
                    continue
                longer = overrun(evaluations, deadline, time.monotonic(), candidate.kind,
                                 recorded_seconds.get(candidate.kind.value, ()))
                if longer is not None:
                    log.info("agent: not started (%s): a %s candidate takes about %.0f s on this machine, %.0f s are "
                             "left", dict(candidate.params).get("change", candidate.kind.value),
                             candidate.kind.value, longer, deadline - time.monotonic())
                    deferred.append(candidate)
                    continue
                log.info("agent: candidate %d (%s %s) for region %s", len(evaluations) + 1, candidate.kind.value,
                         ", ".join(f"{k}={v}" for k, v in candidate.params[1:] or candidate.params),
                         candidate.region_signature[:12])
                verified = stream.outcome(ahead) if pool else None
                if verified is not None and verified.event is not None:
                    event = verified.event
                    log.info("agent: verified ahead on %s in %.1f s", event.worker, event.ended - event.started)
                began = time.monotonic()
                lesser = None
                if candidate.kind is CandidateKind.PASS_CHOICE:
                    lesser = settled_by(candidate, kb.latest(signature=candidate.region_signature,
                                                             environment=environment))
                if lesser is not None:  # adds FP8 rounding to a choice whose model output already missed
                    reason = settled_reason(candidate, lesser)
                    evaluation = Evaluation(candidate, Status.REJECTED, reason,
                                            {"kind": "more-rounding", "accepted": False, "checks": [],
                                             "settled_by": lesser.record_hash, "reason": reason})
                else:
                    evaluation = _evaluate_or_error(candidate, regions[candidate.region_signature], graphs,
                                                    accepted, clock, verify_config, bench_config, bench,
                                                    first.get(candidate.region_signature), verified)
                evaluation = dataclasses.replace(evaluation, seconds=time.monotonic() - began)
                e2e = evaluation.e2e.speedup if evaluation.e2e else None
                if e2e is not None and bench is not None and e2e.baseline:
                    bench.saw_model_call(e2e.baseline)  # the Amdahl bound's base (kopt.agent.micro)
                record = kb.record_candidate(candidate, status=evaluation.status, reason=evaluation.reason,
                                             verdict=evaluation.verdict, micro=evaluation.micro, e2e=e2e,
                                             environment=environment, seconds=evaluation.seconds)
                if evaluation.status is not Status.ERROR:  # the machine's failure teaches nothing of the candidate
                    _lesson(kb, regions[candidate.region_signature], evaluation, record)
                if evaluation.status is Status.ACCEPTED:
                    accepted[candidate.region_signature] = candidate
                log.info("agent: %s: %s", evaluation.status.value, evaluation.reason[:120])
                evaluations.append(evaluation)
                if on_evaluation is not None:
                    on_evaluation(evaluation)
        finally:
            if pool:
                stream.close()
            if hasattr(clock, "close"):  # a regional clock gives the model back uncompiled
                clock.close()
    lowered = {k: ms / 1e3 for k, ms in bench.lowered_ms().items()} if bench is not None else {}
    return OptimizeResult(profile, evaluations, accepted, resumed, skipped, Path(kb.path), graphs, occurrences, clock,
                          time.monotonic() - started, stopped, pool_text, list(stream.events) if pool else [],
                          deferred, lowered)
