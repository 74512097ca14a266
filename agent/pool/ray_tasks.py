"""The Ray executor: each verification is a Ray task, on this machine or on a cluster.

Ray (an optional dependency: ``pip install 'kopt[ray]'``) is imported only when this executor is
chosen. A task asks for ``num_gpus=1`` when the cluster has GPUs (a fraction when more workers than
GPUs were asked for), so Ray places it on a GPU of its own and sets the worker's
``CUDA_VISIBLE_DEVICES``; the task passes that on to its sandbox child. Tasks are never retried: a
worker that dies is reported, and the loop records the candidate as an error. Only the driver (the
loop) writes the knowledge base; a task returns its verdict and nothing else.

Ray already running (``ray.init`` called before, or ``RAY_ADDRESS`` naming a cluster) is used as it
is. Otherwise a local Ray is started with the planned workers' GPUs only (the timing GPU left out
when there are two or more, as for the local executor) and shut down when the run ends. On a
cluster, keep the driver's timing GPU out of Ray's resources (``ray start --num-gpus=0`` on that
node) and install the same kopt on every node: a worker rebuilds each region from its source and
refuses one whose signature differs.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Sequence
from typing import Any

from kopt.agent.pool.job import VerifyJob, VerifyOutcome, run_job
from kopt.agent.pool.workers import AUTO, WorkerSlot

EXTRA = "pip install 'kopt[ray]'"


def import_ray() -> Any:
    """``ray``, or an ImportError that names the extra to install."""
    try:
        import ray
    except ImportError as error:
        raise ImportError(f"executor='ray' needs Ray, an optional dependency of kopt: {EXTRA}") from error
    return ray


def _verify_task(job: VerifyJob) -> VerifyOutcome:
    """Runs in a Ray worker process: verify, the child pinned to the GPU Ray gave this task."""
    import ray

    cuda_devices = os.environ.get("CUDA_VISIBLE_DEVICES") if ray.get_gpu_ids() else None
    return run_job(job, f"ray-{os.getpid()}", cuda_devices)


def _start_local(ray: Any, slots: Sequence[WorkerSlot]) -> None:
    """A local Ray that owns the workers' GPUs only: Ray hands out the GPUs listed in
    ``CUDA_VISIBLE_DEVICES`` when it starts, so the list is narrowed for the start and restored."""
    gpus = sorted({s.cuda_devices for s in slots if s.cuda_devices is not None})
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        if gpus:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        ray.init(num_cpus=len(slots), num_gpus=len(gpus), include_dashboard=False, log_to_driver=False)
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


class RayExecutor:
    """Verifications as Ray tasks; ``slots`` is the local plan, used when this starts Ray itself."""

    name = "ray"

    def __init__(self, requested: int | str, slots: Sequence[WorkerSlot]) -> None:
        self._ray = ray = import_ray()
        self._started = not ray.is_initialized()
        self.shares_timing_device = False  # unknown on a Ray this run did not start
        if self._started:
            if os.environ.get("RAY_ADDRESS"):
                ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
            else:
                _start_local(ray, slots)
                self.shares_timing_device = any(s.shares_timing_device for s in slots)
        resources = ray.cluster_resources()
        gpus, cpus = float(resources.get("GPU", 0)), float(resources.get("CPU", 1))
        count = requested if requested != AUTO else max(1, int(gpus) if gpus >= 1 else int(cpus))
        self.slots = tuple(WorkerSlot(i, None, False) for i in range(count))
        need = {"num_gpus": min(1.0, gpus / count), "num_cpus": 0} if gpus >= 1 else {"num_cpus": 1}
        self.resources = need
        self.placement = "Ray tasks, each " + ", ".join(f"{k}={v:g}" for k, v in need.items())
        self._task = ray.remote(max_retries=0, **need)(_verify_task)
        self._pending: list[tuple[Any, concurrent.futures.Future]] = []

    def submit(self, job: VerifyJob) -> concurrent.futures.Future[VerifyOutcome]:
        ref = self._task.remote(job.portable())
        future = ref.future()
        self._pending = [(r, f) for r, f in self._pending if not f.done()] + [(ref, future)]
        return future

    def close(self) -> None:
        """Cancel tasks not finished; shut Ray down if this executor started it."""
        for ref, future in self._pending:
            if not future.done():
                self._ray.cancel(ref)
        self._pending = []
        if self._started:
            self._ray.shutdown()
