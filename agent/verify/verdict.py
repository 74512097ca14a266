"""The verifier's answer: accepted or rejected, why, and the numbers behind every check."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

Number = float | int | str | bool | None
RESOURCES = "resources"  # the check that fails when the machine, not the candidate, could not run a trial


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """One check on one trial (or on the whole run): did it pass, and what it measured.

    Attributes:
        name: the check (``values``, ``mutation``, ``alias``, ``strides``, ``tamper``, ...).
        passed: whether the candidate met it.
        detail: one sentence for a human.
        trial: the trial it ran on (-1 for checks of the whole run).
        numbers: what it measured (relative error, bound, counts), for the knowledge base.
    """

    name: str
    passed: bool
    detail: str
    trial: int = -1
    numbers: tuple[tuple[str, Number], ...] = ()

    def to_dict(self) -> dict:
        return {"name": self.name, "passed": self.passed, "detail": self.detail, "trial": self.trial,
                "numbers": dict(self.numbers)}

    @staticmethod
    def from_dict(data: Mapping) -> CheckResult:
        return CheckResult(data["name"], bool(data["passed"]), data["detail"], int(data.get("trial", -1)),
                           tuple(data.get("numbers", {}).items()))


@dataclasses.dataclass(frozen=True)
class Timing:
    """Wall time per call measured by the harness (never by the candidate), in a fresh process.

    ``samples_ns`` are the timed calls in order; each ran on a freshly generated input set, and
    each call's output was checked like a verification trial."""

    samples_ns: tuple[int, ...]

    @property
    def median_ns(self) -> float:
        ordered = sorted(self.samples_ns)
        middle = len(ordered) // 2
        return float(ordered[middle]) if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2

    def to_dict(self) -> dict:
        return {"samples_ns": list(self.samples_ns), "median_ns": self.median_ns}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Accepted only if every check passed.

    Attributes:
        accepted: the decision.
        reason: the first failed check's detail (or a summary when accepted).
        checks: every check that ran, failed ones first.
        trials: how many trials ran.
        elapsed_s: wall time of the verification.
        log: what happened, for a human (sandbox notes, per-trial plans, the child's stderr tail).
        timing: the harness's timing, when it was asked for and the candidate passed.
    """

    accepted: bool
    reason: str
    checks: tuple[CheckResult, ...]
    trials: int
    elapsed_s: float
    log: str = ""
    timing: Timing | None = None

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if not c.passed)

    @property
    def inconclusive(self) -> bool:
        """Rejected only because the machine could not run it (every failed check a ``resources`` one):
        the candidate was neither shown wrong nor shown right, so its evaluation is an error to retry.
        One trial that ran and failed settles it: rejected."""
        return not self.accepted and bool(self.failed) and all(c.name == RESOURCES for c in self.failed)

    @property
    def failed_names(self) -> set[str]:
        return {c.name for c in self.failed}

    def to_dict(self) -> dict:
        return {"accepted": self.accepted, "reason": self.reason, "checks": [c.to_dict() for c in self.checks],
                "trials": self.trials, "elapsed_s": self.elapsed_s, "log": self.log,
                "timing": self.timing.to_dict() if self.timing else None}

    @staticmethod
    def from_dict(data: Mapping) -> Verdict:
        timing = data.get("timing")
        return Verdict(bool(data["accepted"]), data["reason"], tuple(CheckResult.from_dict(c) for c in data["checks"]),
                       int(data["trials"]), float(data["elapsed_s"]), data.get("log", ""),
                       Timing(tuple(timing["samples_ns"])) if timing else None)

    def __str__(self) -> str:
        head = "ACCEPTED" if self.accepted else "REJECTED"
        return f"{head}: {self.reason} ({self.trials} trials, {self.elapsed_s:.1f} s)"


def decide(checks: list[CheckResult], trials: int, elapsed_s: float, log: str, timing: Timing | None = None) -> Verdict:
    """A verdict from checks: rejected by the first failure (failures listed first)."""
    failed = [c for c in checks if not c.passed]
    ordered = tuple(failed + [c for c in checks if c.passed])
    if failed:
        first = failed[0]
        where = f" (trial {first.trial})" if first.trial >= 0 else ""
        return Verdict(False, f"{first.name}: {first.detail}{where}", ordered, trials, elapsed_s, log, timing)
    if not checks:
        return Verdict(False, "no check ran", (), trials, elapsed_s, log, timing)
    return Verdict(True, f"all {len(checks)} checks passed on {trials} trials", ordered, trials, elapsed_s, log,
                   timing)
