"""A background thread that calls one function every ``interval_s`` while a ``with`` block runs: what
the benchmarks' samplers share (the GPU's clock and power per row, the compiling thread's stack)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Periodic:
    """Calls ``tick()`` from a daemon thread every ``interval_s`` between ``__enter__`` and ``__exit__``
    (the thread is joined on exit, so no tick runs after the block)."""

    def __init__(self, tick: Callable[[], None], interval_s: float, name: str) -> None:
        self.tick, self.interval_s, self.name = tick, interval_s, name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Periodic:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()
