"""The harness's log: timestamped lines that show where a run cut off by a time limit was."""

from __future__ import annotations

import datetime
import logging
import time


class Log:
    """Timestamped, flushed progress lines: a run cut off by a time limit still shows where it was."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def __call__(self, message: str) -> None:
        clock = datetime.datetime.now().strftime("%H:%M:%S")
        print(f"[{clock} +{self.elapsed():6.1f}s] {message}", flush=True)

    def show_kopt_progress(self) -> None:
        """kopt's INFO lines (each pass, each lowering stage, each autotuning) in this log's format, so
        a compile cut off by a time limit shows the step it was in."""

        log = self

        class Forward(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                log(f"  kopt: {record.getMessage()}")

        logger = logging.getLogger("kopt")
        logger.setLevel(logging.INFO)
        logger.addHandler(Forward())
