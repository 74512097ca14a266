"""kopt.kernels._precompile: a new shape's candidates launched side by side before they are timed,
each in the caller's modes, a failing one left to the timing loop; the worker count's setting."""

from __future__ import annotations

import threading

import pytest
import torch

from kopt.kernels._precompile import precompile, worker_count

CPU = torch.device("cpu")
CANDIDATES = [{"BLOCK": b, "num_warps": w} for b in (1024, 2048, 4096) for w in (4, 8)]


def test_candidates_launch_side_by_side_in_the_callers_modes():
    """The first candidate launches alone in the caller's thread (what it builds once is shared), then
    one worker per other candidate: each of those launches waits at a barrier for all the others, so
    the call returns only if they ran at once; each saw the caller's inference mode; the one that
    raises is left for the timing loop to record."""
    barrier = threading.Barrier(len(CANDIDATES) - 1, timeout=30)
    seen: list[tuple[int, bool, bool, str]] = []
    caller = threading.current_thread().name

    def run(config: dict[str, int]) -> None:
        if config != CANDIDATES[0]:
            barrier.wait()
        seen.append((config["BLOCK"], torch.is_inference_mode_enabled(), torch.is_grad_enabled(),
                     threading.current_thread().name))
        if config == CANDIDATES[-1]:
            raise RuntimeError("out of shared memory")

    with torch.inference_mode():
        workers = precompile(CANDIDATES, run, CPU, threads=8)
    assert workers == len(CANDIDATES) - 1
    assert sorted(b for b, *_ in seen) == sorted(c["BLOCK"] for c in CANDIDATES)
    assert all(inference and not grad for _, inference, grad, _ in seen)
    assert seen[0][3] == caller and all(name.startswith("kopt-autotune") for *_, name in seen[1:])
    assert not barrier.broken


def test_one_worker_leaves_compiling_to_the_timing_loop():
    ran: list[dict[str, int]] = []
    assert precompile(CANDIDATES, ran.append, CPU, threads=1) == 1
    assert ran == []


def test_worker_count_follows_the_setting_and_the_candidates(monkeypatch):
    monkeypatch.setenv("KOPT_AUTOTUNE_THREADS", "3")
    assert worker_count(9) == 3 and worker_count(2) == 2
    assert precompile(CANDIDATES[:2], lambda config: None, CPU) == 1  # one left after the first: no threads
    monkeypatch.setenv("KOPT_AUTOTUNE_THREADS", "1")
    assert worker_count(9) == 1
    monkeypatch.delenv("KOPT_AUTOTUNE_THREADS")
    assert 1 <= worker_count(9) <= 9 and worker_count(1) == 1
    for bad in ("two", "0"):
        monkeypatch.setenv("KOPT_AUTOTUNE_THREADS", bad)
        with pytest.raises(ValueError, match="KOPT_AUTOTUNE_THREADS"):
            worker_count(4)
