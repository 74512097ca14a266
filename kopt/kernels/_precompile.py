"""A shape's candidate configs compiled side by side before the tuner times them one by one.

Autotuning a new shape launches every candidate config, and each first launch JIT-compiles it
(Triton's passes, then ptxas): FP8 attention's nine configs took 10.9 s per shape on an H100, one
after another. Triton's compile passes are native code and ptxas runs as a subprocess, so first
launches run in threads overlap (measured: 5.3 s for the same nine, `s35` in the README). Each
worker launches one candidate on the caller's scratch outputs, on the caller's device and stream,
in the caller's grad and inference modes (both are per thread); the timing that follows finds every
candidate compiled. The first candidate launches alone, in the caller's thread: what is built once
per kernel signature and process (the launcher, LLVM's targets) is built before threads share it.
Valid because a launch on scratch outputs is what the timing loop does anyway:
the same work, in a different order on the same stream, and a candidate that fails here fails
again when timed, where it is recorded as such.

``KOPT_AUTOTUNE_THREADS`` caps the workers (default: the machine's cores, at most 16; 1 compiles
in the timing loop as before).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

Config = dict[str, int]
T = TypeVar("T")
R = TypeVar("R")


def worker_count(candidates: int) -> int:
    """How many threads compile ``candidates`` configs: ``KOPT_AUTOTUNE_THREADS``, else the cores
    (at most 16), never more than there are candidates."""
    text = os.environ.get("KOPT_AUTOTUNE_THREADS", "").strip()
    if text:
        try:
            wanted = int(text)
        except ValueError as error:
            raise ValueError(f"KOPT_AUTOTUNE_THREADS must be a whole number, not {text!r}") from error
        if wanted < 1:
            raise ValueError(f"KOPT_AUTOTUNE_THREADS must be at least 1, not {wanted}")
    else:
        wanted = min(os.cpu_count() or 1, 16)
    return max(1, min(wanted, candidates))


@contextlib.contextmanager
def _as_the_caller(device: torch.device, stream: torch.cuda.Stream | None, grad: bool,
                   inference: bool) -> Iterator[None]:
    """In a worker thread: the caller's device, stream, grad mode and inference mode."""
    with contextlib.ExitStack() as stack:
        if device.type == "cuda":
            stack.enter_context(torch.cuda.device(device))
            if stream is not None:
                stack.enter_context(torch.cuda.stream(stream))
        stack.enter_context(torch.inference_mode(inference))
        stack.enter_context(torch.set_grad_enabled(grad))
        yield


def precompile(candidates: Sequence[Config], run: Callable[[Config], object], device: torch.device,
               threads: int | None = None) -> int:
    """Launch each of ``candidates`` once with ``run``: the first in this thread, the others in up to
    ``threads`` threads (default: :func:`worker_count`), so that their JIT compiles overlap; returns
    the number of workers used (1: nothing done, the timing loop compiles). A candidate that raises
    is left to the timing loop, which records its failure."""
    workers = worker_count(len(candidates) - 1) if threads is None else max(1, min(threads, len(candidates) - 1))
    if workers <= 1:
        return 1
    return side_by_side(candidates, run, device, workers, name="kopt-autotune")[1]


def side_by_side(items: Sequence[T], run: Callable[[T], R], device: torch.device, threads: int | None = None,
                 name: str = "kopt-launch") -> tuple[list[R | None], int]:
    """``run`` each of ``items``: the first alone in this thread (what is built once per kernel signature
    and process is built before threads share it), the others in up to ``threads`` threads (default
    :func:`worker_count`) named ``name``, each in this thread's device, stream, grad and inference
    modes. Returns the results in order (None for an item whose run raised) and the threads used."""
    if not items:
        return [], 0
    rest = list(items[1:])
    workers = worker_count(len(rest)) if threads is None else max(1, min(threads, len(rest)))
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def quietly(item: T) -> R | None:
        try:
            return run(item)
        except Exception:  # noqa: BLE001 - the caller's own run meets the same failure where it handles it
            return None

    def in_worker(item: T) -> R | None:
        with _as_the_caller(device, stream, grad, inference):
            return quietly(item)

    results = [quietly(items[0])]
    if rest:
        with ThreadPoolExecutor(workers, thread_name_prefix=name) as pool:
            results += pool.map(in_worker, rest)
    return results, workers
