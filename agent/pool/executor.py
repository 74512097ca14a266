"""The executors' one interface, and which one a run gets.

``submit(job) -> Future[VerifyOutcome]`` and ``close()``: the local executor (worker processes of
this machine) and the Ray executor (Ray tasks) both run :func:`kopt.agent.pool.job.run_job` on a
worker. A run verifies inline, as the loop did before the pool, when the executor is local and its
only worker shares the timing device: verifying ahead there would only make the two compete.
"""

from __future__ import annotations

import concurrent.futures
from typing import Protocol

from kopt.agent.pool.job import VerifyJob, VerifyOutcome
from kopt.agent.pool.workers import WorkerSlot, plan_workers, visible_gpus

EXECUTORS = ("local", "ray")


class Executor(Protocol):
    """Runs verification jobs on its workers."""

    name: str
    slots: tuple[WorkerSlot, ...]
    placement: str  # where the workers run, for a human
    shares_timing_device: bool  # some worker competes with the timing (known for a pool started here)

    def submit(self, job: VerifyJob) -> concurrent.futures.Future[VerifyOutcome]: ...

    def close(self) -> None: ...


def timing_gpu(device_type: str, device_index: int | None) -> int | None:
    """The ordinal of the GPU end-to-end timing runs on, or None when it runs on the CPU."""
    if device_type != "cuda":
        return None
    if device_index is not None:
        return device_index
    import torch

    return torch.cuda.current_device()


def make_executor(executor: str, workers: int | str, timing: int | None,
                  gpus: list[str] | None = None) -> Executor | None:
    """The executor for ``executor`` (``"local"`` or ``"ray"``) and ``workers`` (``"auto"`` or a
    count), with the timing on GPU ordinal ``timing`` (None: the CPU); None means verify inline."""
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    slots = plan_workers(workers, visible_gpus() if gpus is None else gpus, timing)
    if executor == "ray":
        from kopt.agent.pool.ray_tasks import RayExecutor

        return RayExecutor(workers, slots)
    if len(slots) == 1 and slots[0].shares_timing_device:
        return None
    from kopt.agent.pool.local import LocalExecutor

    return LocalExecutor(slots)
