"""The verifier: a candidate replaces a region only if it computes the same, checked like an attack.

    from kopt.agent.verify import verify, VerifyConfig
    verdict = verify(region, candidate)          # Verdict: accepted, reason, checks, log
    timing, checks = time_candidate(region, candidate)

Files, each one concept: :mod:`.plan` (trials), :mod:`.values` (edge-value profiles),
:mod:`.reference` (the original's outputs, computed after the child exits), :mod:`.workdir` (files
shared with the child), :mod:`.sandbox` (the child process), :mod:`.child` and :mod:`.guard` (what
runs inside it), :mod:`.compare` (numeric rules), :mod:`.checks` (every other rule),
:mod:`.verdict` (the answer), :mod:`.verifier` (the sequence).
"""

from kopt.agent.verify.config import TimingConfig, VerifyConfig
from kopt.agent.verify.verdict import CheckResult, Timing, Verdict
from kopt.agent.verify.verifier import static_checks, time_candidate, verify

__all__ = ["CheckResult", "Timing", "TimingConfig", "Verdict", "VerifyConfig", "static_checks", "time_candidate",
           "verify"]
