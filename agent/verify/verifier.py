"""Verify a candidate against its region: plan trials, run the child, check, decide.

:func:`verify` is the entry point the agent's loop calls for every candidate; :func:`time_candidate`
measures an accepted one (or the original) in a fresh process, checking every timed call's
output too, so a fast wrong answer is never a measurement.
"""

from __future__ import annotations

import ast
import tempfile
import time
from pathlib import Path

from kopt.agent.candidate import Candidate, Convention
from kopt.agent.region import Region
from kopt.agent.verify.checks import call_checks, run_checks
from kopt.agent.verify.config import GENERATED_ORIGINS, TimingConfig, VerifyConfig
from kopt.agent.verify.plan import TrialPlan, plan_trials
from kopt.agent.verify.reference import expected_outputs, reference, trial_inputs
from kopt.agent.verify.sandbox import ChildRun, run_child
from kopt.agent.verify.values import Profile
from kopt.agent.verify.verdict import CheckResult, Timing, Verdict, decide
from kopt.agent.verify.workdir import WorkDir, python_read_paths

MAX_SOURCE_BYTES = 256 * 1024


def static_checks(region: Region, candidate: Candidate) -> list[CheckResult]:
    """Before anything runs: the candidate is for this region, parses, and defines its entry point."""
    if candidate.region_signature != region.signature:
        return [CheckResult("static", False, f"the candidate is for region {candidate.region_signature[:12]}, "
                                             f"not {region.signature[:12]}")]
    if len(candidate.source.encode()) > MAX_SOURCE_BYTES:
        return [CheckResult("static", False, f"source larger than {MAX_SOURCE_BYTES} bytes")]
    try:
        tree = ast.parse(candidate.source)
    except SyntaxError as error:
        return [CheckResult("static", False, f"source does not parse: {error.msg} (line {error.lineno})")]
    defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    defined |= {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name)}
    if candidate.entry_point not in defined:
        return [CheckResult("static", False, f"no top-level definition of {candidate.entry_point!r}")]
    return [CheckResult("static", True, "parses and defines its entry point")]


def _prepare(root: Path, region: Region, candidate: Candidate, config: VerifyConfig,
             plans: list[TrialPlan], calls_per_set: int, warmup: int, device: str = "cpu") -> WorkDir:
    work = WorkDir(root)
    for plan in plans:
        inputs = trial_inputs(region, plan)
        work.add_set(inputs, expected_outputs(region, plan, inputs))
    for _ in range(warmup):
        work.add_call(0)
    for _ in range(calls_per_set):
        for index in range(len(plans)):
            work.add_call(index)
    work.write(candidate, config, python_read_paths(), device)
    return work


def _trial_checks(run: ChildRun, work: WorkDir, region: Region, candidate: Candidate, config: VerifyConfig,
                  plans: list[TrialPlan], first_checked_call: int) -> tuple[list[CheckResult], list[str]]:
    checks, log = run_checks(run), []
    if run.report is None or any(not c.passed for c in checks):
        return checks, log
    calls = run.report.get("calls", [])
    expected = len(work.calls)
    if len(calls) < expected:
        checks.append(CheckResult("process", False, f"only {len(calls)} of {expected} calls ran"))
    refs = {}
    last_call = {s: i for i, (s, _) in enumerate(work.calls)}
    for index, call in enumerate(calls[:expected]):
        set_index = work.calls[index][0]
        if index < first_checked_call:
            continue
        if set_index not in refs:
            refs[set_index] = reference(region, plans[set_index], work.inputs[set_index])
            if refs[set_index].exact_note:
                log.append(refs[set_index].exact_note)
        checks += call_checks(set_index, call, work, index, set_index, refs[set_index], candidate, config,
                              check_late=last_call[set_index] == index)
    return checks, log


def trial_device(candidate: Candidate, config: VerifyConfig) -> str:
    """Where ``candidate``'s trials run: ``config.device`` for code kopt generated, else the CPU, behind
    every wall (an LLM's or a person's candidate never leaves them)."""
    return config.device if candidate.origin in GENERATED_ORIGINS else "cpu"


def release_cached_device_memory() -> None:
    """A GPU child allocates on the device this process uses, whose caching allocator may hold memory
    it no longer uses (blocks freed since the model's last runs): hand that back to the driver first,
    or the child runs out of memory that nothing needs."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def verify(region: Region, candidate: Candidate, config: VerifyConfig | None = None,
           timing: TimingConfig | None = None) -> Verdict:
    """Accept ``candidate`` as a replacement for ``region`` only if every check passes on every
    trial; with ``timing``, an accepted candidate is then timed (:func:`time_candidate`)."""
    config = config or VerifyConfig()
    started = time.monotonic()
    checks = static_checks(region, candidate)
    if not checks[0].passed:
        return decide(checks, 0, time.monotonic() - started, "")
    plans, notes = plan_trials(region, shape_specialized=candidate.shape_specialized, config=config,
                               contract=candidate.contract)
    log = list(notes) + [f"trial {i}: {p.describe()}" for i, p in enumerate(plans)]
    device = trial_device(candidate, config)
    if device != "cpu":
        log.append(f"trials on {device}: a candidate kopt generated (the walls a GPU child keeps: "
                   f"kopt.agent.verify.child)")
    if device != "cpu":
        release_cached_device_memory()
    with tempfile.TemporaryDirectory(prefix="kopt-verify-") as folder:
        work = _prepare(Path(folder), region, candidate, config, plans, calls_per_set=1, warmup=0, device=device)
        run = run_child(Path(folder), timeout_s=config.timeout_s, threads=config.threads, python=config.python,
                        cuda_devices=config.cuda_devices, fresh_interpreter=device != "cpu", gpu=device != "cpu")
        found, extra = _trial_checks(run, work, region, candidate, config, plans, 0)
    checks += found
    log += (run.report or {}).get("notes", []) + extra
    if run.stderr_tail.strip():
        log.append("child stderr (tail): " + run.stderr_tail.strip()[-1500:])
    verdict = decide(checks, len(plans), time.monotonic() - started, "\n".join(log))
    if verdict.accepted and timing is not None:
        measured, timing_checks = time_candidate(region, candidate, config, timing)
        verdict = decide(checks + timing_checks, len(plans), time.monotonic() - started, verdict.log, measured)
    return verdict


def time_candidate(region: Region, candidate: Candidate, config: VerifyConfig | None = None,
                   timing: TimingConfig | None = None) -> tuple[Timing | None, list[CheckResult]]:
    """Time ``candidate`` at the region's own shapes in a fresh child process: the harness reads the
    clock around each call (the candidate cannot patch it: it was bound before the candidate was
    loaded, and any patch is reported), every call gets its own freshly generated input set, and
    every timed call's output is checked, so caching and work hidden after the return both fail.
    ``timing.device`` says where the calls run (a GPU for a model on the GPU)."""
    config, timing = config or VerifyConfig(), timing or TimingConfig()
    base = config.seed if config.seed is not None else time.time_ns() % 2**31
    plans = [TrialPlan((), (Profile.NORMAL,) * len(region.inputs), base + k) for k in range(timing.input_sets)]
    if timing.device != "cpu":
        release_cached_device_memory()
    with tempfile.TemporaryDirectory(prefix="kopt-time-") as folder:
        work = _prepare(Path(folder), region, candidate, config, plans, calls_per_set=timing.rounds,
                        warmup=timing.warmup, device=timing.device)
        run = run_child(Path(folder), timeout_s=config.timeout_s, threads=config.threads, python=config.python,
                        fresh_interpreter=True, cuda_devices=config.cuda_devices, gpu=timing.device != "cpu")
        checks, _ = _trial_checks(run, work, region, candidate, config, plans, timing.warmup)
    checks = [CheckResult(f"timing-{c.name}", c.passed, c.detail, c.trial, c.numbers) for c in checks]
    if run.report is None or not all(c.passed for c in checks):
        return None, checks
    samples = tuple(int(c["ns"]) for c in run.report["calls"][timing.warmup:])
    return Timing(samples), checks


__all__ = ["Convention", "static_checks", "time_candidate", "trial_device", "verify"]
