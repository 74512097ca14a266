"""The local executor: one worker process per slot, each driving the existing sandbox.

Processes, not threads of this one: the verifier's own part of a verification (drawing inputs,
the float64 reference, the checks) is Python holding the GIL, and here it would slow the loop's
timing, which runs Python op by op; and CPython keeps the recursion counter of ``ast.parse``'s
tree construction per interpreter, so two threads parsing at once can fail with ``SystemError``.
A worker is ``python -m kopt.agent.pool.worker_main`` (:mod:`.worker_main`), not a
``multiprocessing`` child, so the user's main script is never imported again. One feeder thread
per worker hands it queued jobs one at a time; a worker that dies fails its job (the loop records
an error) and is started again for the next one.
"""

from __future__ import annotations

import concurrent.futures
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence

from kopt.agent.pool.frames import receive, send
from kopt.agent.pool.job import VerifyJob, VerifyOutcome
from kopt.agent.pool.workers import WorkerSlot


class WorkerDied(RuntimeError):
    """A worker process ended before it answered."""


class _Worker:
    """One worker process for ``slot``, started again after it dies."""

    def __init__(self, slot: WorkerSlot) -> None:
        self.slot, self.name = slot, f"local-{slot.index}"
        self.process: subprocess.Popen | None = None
        self.stderr = tempfile.TemporaryFile()

    def start(self) -> None:
        extra = [self.slot.cuda_devices] if self.slot.cuda_devices is not None else []
        self.process = subprocess.Popen([sys.executable, "-m", "kopt.agent.pool.worker_main", self.name, *extra],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)

    def _died(self) -> WorkerDied:
        code = self.process.wait()
        self.process = None
        how = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        self.stderr.seek(0)
        tail = self.stderr.read()[-800:].decode(errors="replace").strip()
        return WorkerDied(f"worker process {self.name} died ({how})" + (f"; its stderr ends: {tail}" if tail else ""))

    def run(self, job: VerifyJob) -> VerifyOutcome:
        if self.process is None:
            self.start()
        try:
            send(self.process.stdin, job.portable())
            outcome = receive(self.process.stdout)
        except OSError:  # the pipe broke: the process is gone
            outcome = None
        if outcome is None:
            raise self._died()
        return outcome

    def stop(self) -> None:
        """Close its stdin: it finishes the job in hand (bounded by the sandbox's limits) and exits."""
        if self.process is not None and self.process.stdin:
            try:
                self.process.stdin.close()
            except OSError:
                pass


class LocalExecutor:
    """Verifications on ``len(slots)`` worker processes of this machine."""

    name = "local"

    def __init__(self, slots: Sequence[WorkerSlot]) -> None:
        if not slots:
            raise ValueError("a pool needs at least one worker")
        self.slots = tuple(slots)
        self.placement = ", ".join(s.device for s in self.slots)
        self.shares_timing_device = any(s.shares_timing_device for s in self.slots)
        self.workers = [_Worker(slot) for slot in self.slots]
        self._queue: queue.Queue = queue.Queue()
        for worker in self.workers:  # each process starts with its first job
            threading.Thread(target=self._feed, args=(worker,), name=f"kopt-pool-{worker.name}", daemon=True).start()

    def _feed(self, worker: _Worker) -> None:
        while (item := self._queue.get()) is not None:
            job, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(worker.run(job))
            except Exception as failure:  # noqa: BLE001 - the job's failure, reported through its future
                future.set_exception(failure)
        worker.stop()

    def submit(self, job: VerifyJob) -> concurrent.futures.Future[VerifyOutcome]:
        future: concurrent.futures.Future[VerifyOutcome] = concurrent.futures.Future()
        self._queue.put((job, future))
        return future

    def close(self) -> None:
        """Drop queued jobs; each worker finishes the job in hand, then exits."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[1].cancel()
        for _ in self.workers:
            self._queue.put(None)
