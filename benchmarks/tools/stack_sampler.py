"""A sampling profiler for one thread: where a compile's wall-clock seconds go, without cProfile's cost.

    with StackSampler() as sampler:
        compile_and_run()
    print(sampler.report(top=40))

cProfile charges every Python call, so code made of many small calls (fake-tensor propagation,
dynamo's tracing) looks several times costlier under it than it is, and a profile of a compile points
at the wrong place. This sampler instead reads the profiled thread's stack from a background thread
every ``interval_s`` and charges the time since the previous sample to each function on the stack
(inclusive) and to the innermost Python frame (own).

Why the estimate holds: a sample is the profiled thread's state at the moment the sampler got the
GIL, and the sampler gets it only when the thread lets go of it: at once while the thread waits (on
the GPU, on a lock, in ``time.sleep``), after up to the switch interval (5 ms) while it runs Python.
Counting samples would then overweight waits; charging each sample the time since the one before
gives each state the wall time it held the thread. A long C call that keeps the GIL (one big tensor
op on the CPU) is charged to whatever the thread does when it returns, its caller's frame.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
import types
from pathlib import Path

from benchmarks.tools.periodic import Periodic


def _frame_name(frame: types.FrameType) -> str:
    code = frame.f_code
    return f"{Path(code.co_filename).name}:{code.co_firstlineno}({code.co_name})"


class StackSampler:
    """Samples the stack of the thread that enters it (module docstring)."""

    def __init__(self, interval_s: float = 0.005, max_depth: int = 400) -> None:
        self.interval_s = interval_s
        self.max_depth = max_depth
        self.inclusive: collections.defaultdict[str, float] = collections.defaultdict(float)  # seconds
        self.own: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.samples = 0
        self.elapsed_s = 0.0
        self._target: int | None = None
        self._periodic = Periodic(self._tick, interval_s, "stack-sampler")
        self._started = self._last = 0.0

    def __enter__(self) -> StackSampler:
        self._target = threading.get_ident()
        self._started = self._last = time.perf_counter()
        self._periodic.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._periodic.__exit__(*exc)
        self.elapsed_s = time.perf_counter() - self._started

    def _tick(self) -> None:
        frame = sys._current_frames().get(self._target)  # noqa: SLF001 - the documented way to sample
        now = time.perf_counter()
        held, self._last = now - self._last, now
        if frame is None:
            return
        names: list[str] = []
        while frame is not None and len(names) < self.max_depth:
            names.append(_frame_name(frame))
            frame = frame.f_back
        if not names:
            return
        self.samples += 1
        self.own[names[0]] += held
        for name in set(names):  # a recursive function counts once per sample
            self.inclusive[name] += held

    def seconds_in(self, suffix: str, inclusive: bool = True) -> float:
        """The estimated seconds of the function whose name ends with ``suffix`` (e.g. ``"(_spin)"``)."""
        table = self.inclusive if inclusive else self.own
        return sum(seconds for name, seconds in table.items() if name.endswith(suffix))

    def report(self, top: int = 40) -> str:
        """The ``top`` functions by inclusive and by own time, each with its estimated seconds."""
        lines = [f"{self.samples} samples over {self.elapsed_s:.1f} s (one every {self.interval_s * 1e3:.0f} ms "
                 "or when the thread lets go of the GIL)"]
        for title, table in (("inclusive (on the stack)", self.inclusive), ("own (innermost Python frame)", self.own)):
            lines.append(f"\n==== the {top} functions with the most time, {title} ====")
            lines.append(f"{'seconds':>8} {'share':>6}  function")
            for name, seconds in sorted(table.items(), key=lambda item: -item[1])[:top]:
                lines.append(f"{seconds:8.2f} {seconds / max(self.elapsed_s, 1e-9):6.1%}  {name}")
        return "\n".join(lines) + "\n"
