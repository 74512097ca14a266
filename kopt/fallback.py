"""Noticing when calls of a compiled module run eagerly instead of through kopt, and saying why.

Dynamo gives up on a frame silently (a log line at most) when it has compiled it ``recompile_limit``
times (8) and a call matches none of those graphs: the call, and every later one that matches none,
runs the model eagerly. kopt notices two ways, both version-independent:

* per call: a :class:`~kopt.api.KoptModule` counts the compiled kopt graphs a call ran; a call that
  ran none ran eagerly (:func:`note_eager_call`), and the report and an :class:`EagerFallbackWarning`
  say so;
* the reason: dynamo's own warning when it hits the limit (logger ``torch._dynamo.convert_frame``,
  the same message in torch 2.11-2.14) is read by a logging filter while a kopt module's call is
  running, and kept in that module's report (the limit, the function, dynamo's last recompile reason).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections.abc import Iterator

from kopt.report import Report

_LIMIT_MESSAGE = "torch._dynamo hit config."  # the start of dynamo's format string (convert_frame.py)
_DYNAMO_LOGGER = "torch._dynamo.convert_frame"


class EagerFallbackWarning(UserWarning):
    """Calls of a kopt-compiled module ran eagerly (without kopt's graph); the message says why."""


class _Watched(threading.local):
    def __init__(self) -> None:
        self.reports: list[Report] = []


_watched = _Watched()


class _RecompileLimitFilter(logging.Filter):
    """Copies dynamo's recompile-limit warning into the report of the kopt call that caused it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _watched.reports and isinstance(record.msg, str) and record.msg.startswith(_LIMIT_MESSAGE):
            try:
                limit, value, function, reason = record.args[:4]  # type: ignore[index]
                text = (f"dynamo hit config.{limit} ({value}) compiling {function}; its last recompile reason: "
                        f"{reason}")
            except (TypeError, ValueError):
                text = record.getMessage().splitlines()[0]
            _watched.reports[-1].recompile_limit = text
        return True  # dynamo's own message is still printed


_FILTER = _RecompileLimitFilter()
_install_lock = threading.Lock()


def _install() -> None:
    logger = logging.getLogger(_DYNAMO_LOGGER)
    with _install_lock:
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


@contextlib.contextmanager
def watching(report: Report) -> Iterator[None]:
    """Attribute dynamo's recompile-limit warnings raised inside this block to ``report``."""
    _install()
    _watched.reports.append(report)
    try:
        yield
    finally:
        _watched.reports.pop()


def eager_reason(report: Report) -> str:
    """Why a call ran no kopt graph, from what the report knows."""
    if report.recompile_limit:
        return (f"{report.recompile_limit}. Calls that match none of the compiled graphs run eagerly; "
                "compile with dynamic=None or True (one graph for every size) instead of a graph per shape")
    if not report.graphs:
        return "dynamo compiled no graph for the forward (no tensor operations, or the frame is skipped)"
    return "no compiled graph matched the call and dynamo did not compile a new one"


def note_eager_call(report: Report, stacklevel: int = 3) -> None:
    """Record that a call ran eagerly, and warn (once per reason and call site, as warnings do)."""
    report.eager_calls += 1
    report.eager_fallback = eager_reason(report)
    warnings.warn(f"kopt: a call ran eagerly, without kopt's compiled graph: {report.eager_fallback}",
                  EagerFallbackWarning, stacklevel=stacklevel)
