"""From a finished child run to check results, one rule per function.

The child's report says what the candidate returned (types, layout, shared memory) and whether it
misbehaved (refused operations, tampering, threads left behind); the parent's own files say what
the values were and whether inputs changed. Values are compared with references computed here,
after the child exited.
"""

from __future__ import annotations

import torch

from kopt.agent.candidate import Candidate, Convention
from kopt.agent.verify.compare import compare
from kopt.agent.verify.config import VerifyConfig
from kopt.agent.verify.reference import Reference
from kopt.agent.verify.sandbox import ChildRun
from kopt.agent.verify.verdict import RESOURCES, CheckResult
from kopt.agent.verify.workdir import WorkDir
from kopt.fx.layout import same_layout

OUT_OF_MEMORY = ("OutOfMemoryError", "CUDA out of memory")


def out_of_memory(text: str) -> bool:
    """Whether ``text`` (an exception's or a process's last output) says the device ran out of memory."""
    return any(marker in text for marker in OUT_OF_MEMORY)


def _resources(detail: str, trial: int = -1) -> CheckResult:
    """A failed ``resources`` check: the machine could not run the trial (another process, the model
    under optimization, holds the device's memory). It says nothing about the candidate either way:
    :attr:`Verdict.inconclusive`, an evaluation to retry, never a rejection nor an acceptance."""
    return CheckResult(RESOURCES, False, f"out of device memory, not the candidate's verdict: {detail}", trial)


def run_checks(run: ChildRun) -> list[CheckResult]:
    """Whole-run rules: the child reported, loaded the candidate, refused nothing, saw no tampering,
    was not stopped, left no thread behind."""
    if run.report is None:
        tail = (run.stdout_tail + run.stderr_tail)[-600:].strip()
        if not run.timed_out and out_of_memory(tail):
            return [_resources(run.ended() + f"; last output: {tail}")]
        return [CheckResult("process", False, run.ended() + (f"; last output: {tail}" if tail else ""))]
    report = run.report
    checks = [CheckResult("process", True, "the harness reported")]
    if report.get("load_error"):
        checks.append(CheckResult("load", False, f"loading the candidate failed: {report['load_error']}"))
    refused = report.get("refused") or []
    checks.append(CheckResult("sandbox", not refused, f"forbidden operation: {refused[0]}" if refused
                              else "no forbidden operation", numbers=(("refused", len(refused)),)))
    tampered = report.get("tampered") or []
    if tampered:
        checks.append(CheckResult("tamper", False, "changed " + "; ".join(tampered[:6])))
    if report.get("stopped"):
        name = "tamper" if report["stopped"].startswith("tampering") else "process"
        checks.append(CheckResult(name, False, report["stopped"]))
    return checks


def structure_checks(trial: int, described: list[dict] | None, ref: Reference,
                     convention: Convention) -> list[CheckResult]:
    """dtype, shape, strides and shared memory of what the candidate returned, against the original."""
    if convention is Convention.OUT or described is None:
        return []
    checks = []
    for index, (got, want) in enumerate(zip(described, ref.native, strict=False)):
        dtype = str(want.dtype).removeprefix("torch.")
        if got["dtype"] != dtype:
            checks.append(CheckResult("dtype", False, f"output {index} is {got['dtype']}, the original's is {dtype}",
                                      trial))
        if tuple(got["shape"]) != tuple(want.shape):
            checks.append(CheckResult("shape", False, f"output {index} has shape {tuple(got['shape'])}, the "
                                                      f"original's {tuple(want.shape)}", trial))
        elif not same_layout(want.shape, got["stride"], want.stride()):
            checks.append(CheckResult("strides", False, f"output {index} has strides {tuple(got['stride'])}, the "
                                                        f"original's {want.stride()} (later ops assume its layout)",
                                      trial))
        extra_inputs = set(got["aliases_inputs"]) - ref.input_aliases[index]
        if extra_inputs:
            checks.append(CheckResult("alias", False, f"output {index} shares memory with input(s) "
                                                      f"{sorted(extra_inputs)}; the original's does not", trial))
        extra_outputs = set(got["overlaps_outputs"]) - ref.output_overlaps[index]
        if extra_outputs:
            checks.append(CheckResult("alias", False, f"output {index} overlaps output(s) {sorted(extra_outputs)}; "
                                                      "the original's do not", trial))
    return checks


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.is_floating_point():
        return bool(torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a[~torch.isnan(a)], b[~torch.isnan(b)]))
    return bool(torch.equal(a, b))


def value_checks(trial: int, outputs: list[torch.Tensor], ref: Reference, candidate: Candidate,
                 config: VerifyConfig) -> list[CheckResult]:
    """Each output against the contract (see :mod:`kopt.agent.verify.compare`)."""
    checks = []
    for index, (got, native, exact, moved) in enumerate(zip(outputs, ref.native, ref.exact, ref.sensitivity,
                                                            strict=True)):
        result = compare(got, native, exact, candidate.contract, config.slack, moved)
        checks.append(CheckResult("values", result.ok, f"output {index}: {result.detail}", trial,
                                  result.numbers()))
    return checks


def late_checks(trial: int, snapshot: list[torch.Tensor], late: list[torch.Tensor]) -> list[CheckResult]:
    """The outputs must not change after the call returned (background writes, buffers reused by a
    later call, a cached tensor handed out twice)."""
    changed = [i for i, (a, b) in enumerate(zip(snapshot, late, strict=True)) if not _same_values(a, b)]
    if changed:
        return [CheckResult("late-write", False, f"output(s) {changed} changed after the call returned "
                                                 "(background work, or a buffer reused by a later call)", trial)]
    return []


def call_checks(trial: int, call: dict, work: WorkDir, call_index: int, set_index: int, ref: Reference,
                candidate: Candidate, config: VerifyConfig, check_late: bool) -> list[CheckResult]:
    """Every per-call rule for one call on input set ``set_index``."""
    if call.get("error"):
        if out_of_memory(call["error"]):
            return [_resources(call["error"], trial)]
        return [CheckResult("runs", False, call["error"], trial)]
    checks = structure_checks(trial, call.get("outputs"), ref, candidate.convention)
    mutated = work.mutated_inputs(set_index)
    if mutated:
        checks.append(CheckResult("mutation", False, f"input(s) {mutated} were modified", trial))
    if checks:
        return checks
    snapshot = work.snapshot(call_index)
    checks = value_checks(trial, snapshot, ref, candidate, config)
    if check_late:
        checks += late_checks(trial, snapshot, work.late(set_index))
    return checks
