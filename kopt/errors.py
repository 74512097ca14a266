"""The errors kopt raises from a compiled graph (re-exported by :mod:`kopt`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class WeightsChangedError(RuntimeError):
    """Frozen weights changed after compiling and ``on_weight_change=WeightChange.RAISE``."""


class VerificationFailed(RuntimeError):
    """``verify=True`` and ``strict=True``, and the rewritten graph broke a pass's contract."""


class LoweringCheckFailed(VerificationFailed):
    """``strict=True``, and the lowered graph failed its numeric check (:mod:`kopt.checks`)."""


class CompileDuringCapture(RuntimeError):
    """Dynamo asked kopt to compile a graph while the current CUDA stream was capturing a graph.

    Compiling runs device work (folding constants, first-call checks, Inductor's autotuning) that a
    capture would record instead of running: the compiled graph would hold values never computed.
    kopt refuses, so the capture fails; its own whole-forward recording then warms up the way the
    capture runs (:mod:`kopt.capture_branch`) and compiles what that needs before recording again.
    A user capturing a kopt module should call it once with the same inputs outside the capture first."""


@contextlib.contextmanager
def kopt_errors_unwrapped() -> Iterator[None]:
    """Raise kopt's own errors (a failed pass, verification or weight check, a released weight) as
    themselves rather than as the ``BackendCompilerFailed`` dynamo wraps a backend's errors in: they
    are the user's to act on, not a compiler crash."""
    from kopt.passes.manager import PassFailed  # imports the passes, which import this module
    from kopt.release import WeightsReleasedError

    try:
        yield
    except torch._dynamo.exc.BackendCompilerFailed as error:
        inner = getattr(error, "inner_exception", None)
        if isinstance(inner, (PassFailed, VerificationFailed, WeightsChangedError, WeightsReleasedError,
                              CompileDuringCapture)):
            raise inner from None
        raise
