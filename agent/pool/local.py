"""The local executor: one thread per worker, each driving the existing sandbox.

Threads are enough: the candidate runs in the sandbox's own child process (forked from the fork
server, which serves every thread), and what the worker does itself (planning trials, computing the
reference after the child exits) is torch work that releases the GIL. Each thread claims a
:class:`~kopt.agent.pool.workers.WorkerSlot` when it starts, so every verification it runs pins its
child to that slot's GPU.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
from collections.abc import Sequence

from kopt.agent.pool.job import VerifyJob, VerifyOutcome, run_job
from kopt.agent.pool.workers import WorkerSlot


class LocalExecutor:
    """Verifications on ``len(slots)`` threads of this process."""

    name = "local"

    def __init__(self, slots: Sequence[WorkerSlot]) -> None:
        if not slots:
            raise ValueError("a pool needs at least one worker")
        self.slots = tuple(slots)
        self._next = itertools.count()
        self._mine = threading.local()
        self._threads = concurrent.futures.ThreadPoolExecutor(len(self.slots), thread_name_prefix="kopt-verify",
                                                              initializer=self._claim)

    def _claim(self) -> None:
        self._mine.slot = self.slots[next(self._next)]

    def _run(self, job: VerifyJob) -> VerifyOutcome:
        slot = self._mine.slot
        return run_job(job, f"local-{slot.index}", slot.cuda_devices)

    def submit(self, job: VerifyJob) -> concurrent.futures.Future[VerifyOutcome]:
        return self._threads.submit(self._run, job)

    def close(self) -> None:
        """Drop queued jobs; one already running finishes under the sandbox's own time limits."""
        self._threads.shutdown(wait=False, cancel_futures=True)
