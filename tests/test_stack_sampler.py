"""The stack sampler (``benchmarks/tools/stack_sampler.py``) charges wall time to the functions on the
sampled thread's stack in proportion to the time spent there, whatever they call."""

from __future__ import annotations

import time

from benchmarks.tools.stack_sampler import StackSampler


def _spin(seconds: float) -> int:
    """Pure Python work: many small calls, what cProfile overstates."""
    end, n = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        n += _tiny(n)
    return n


def _tiny(n: int) -> int:
    return 1 if n >= 0 else 0


def _wait(seconds: float) -> None:
    time.sleep(seconds)  # a C call that releases the GIL, as a GPU wait does


def _work() -> None:
    _spin(0.6)
    _wait(0.3)


def test_each_function_gets_its_share_of_the_wall_time():
    with StackSampler(interval_s=0.002) as sampler:
        _work()
    assert sampler.samples > 100 and 0.85 < sampler.elapsed_s < 2.0
    spin, wait, work = (sampler.seconds_in(f"({name})") for name in ("_spin", "_wait", "_work"))
    assert 0.5 < spin < 0.7, spin  # 0.6 s of the 0.9, though it lets the sampler in 5x less often
    assert 0.22 < wait < 0.38, wait  # 0.3 s, and innermost: time.sleep is no Python frame
    assert work > 0.9 * sampler.elapsed_s
    assert sampler.seconds_in("(_wait)", inclusive=False) > 0.2
    text = sampler.report(top=30)
    assert "(_work)" in text and "inclusive" in text and "own" in text
