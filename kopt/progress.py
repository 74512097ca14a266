"""Progress of a compile on stderr: one status line rewritten in place on a terminal, plain lines otherwise.

kopt logs each step of a compile at INFO on the ``kopt`` logger: dynamo tracing, capture, every pass,
each lowering stage and every kernel autotuning (``kopt/kernels/_autotune.py``). Those records are the
progress; this module only shows them while a compile runs, so a model that takes minutes to compile
is never silent, and a program that configured logging itself gets the same records its own way.

``progress``: ``True`` shows them (a status line when stderr is a terminal, else one line per step),
``False`` shows nothing, ``None`` (auto) shows the status line on a terminal unless logging already
shows kopt's INFO records somewhere.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

LOGGER = "kopt"
_lock = threading.Lock()
_showing = 0  # compiles inside an active display (a first call wraps its graphs' compiles): shown once


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _logging_shows_progress() -> bool:
    logger = logging.getLogger(LOGGER)
    return logger.isEnabledFor(logging.INFO) and logger.hasHandlers()


def wanted(setting: bool | None, stream: TextIO) -> bool:
    """Whether to show progress on ``stream`` for the ``progress`` option ``setting``."""
    if setting is not None:
        return setting
    return _is_terminal(stream) and not _logging_shows_progress()


class _Display(logging.Handler):
    """Each record as ``kopt [  12.3 s] message``: rewritten in place on a terminal, one line each otherwise."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(logging.INFO)
        self.stream, self.terminal, self.start = stream, _is_terminal(stream), time.monotonic()
        self.open_line = False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"kopt [{time.monotonic() - self.start:6.1f} s] {record.getMessage()}"
            if self.terminal:
                width = shutil.get_terminal_size().columns - 1
                self.stream.write("\r\x1b[2K" + text[:width])  # back to the line start, clear it, rewrite
                self.open_line = True
            else:
                self.stream.write(text + "\n")
            self.stream.flush()
        except Exception:  # noqa: BLE001 - a display must never break a compile
            self.handleError(record)

    def finish(self) -> None:
        """Leave the last status visible, on a line of its own."""
        if self.open_line:
            self.stream.write("\n")
            self.stream.flush()


@contextlib.contextmanager
def show_progress(setting: bool | None, stream: TextIO | None = None) -> Iterator[None]:
    """While active, kopt's INFO records are shown on ``stream`` (stderr) if :func:`wanted` says so."""
    global _showing
    stream = stream or sys.stderr
    with _lock:
        nested = _showing > 0
        if nested or not wanted(setting, stream):
            display = None
        else:
            _showing += 1
            display = _Display(stream)
            logger = logging.getLogger(LOGGER)
            level = logger.level
            if not logger.isEnabledFor(logging.INFO):
                logger.setLevel(logging.INFO)
            logger.addHandler(display)
    if display is None:
        yield
        return
    try:
        yield
    finally:
        with _lock:
            logger.removeHandler(display)
            logger.setLevel(level)
            _showing -= 1
        display.finish()


def first_call_shows_progress(fn: Callable[..., Any], setting: bool | None) -> Callable[..., Any]:
    """``fn``, showing progress during its first call: a lowered graph's kernels autotune at their first
    launch, which for ``torch.compile(backend="kopt")`` happens after the compile itself returned."""
    first = [True]

    def call(*args: Any) -> Any:
        if not first[0]:
            return fn(*args)
        first[0] = False
        with show_progress(setting):
            return fn(*args)

    return call
