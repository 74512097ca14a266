"""One verification as a pool runs it: the job sent to a worker, and what comes back.

The job is plain data. A worker runs in another process (a local worker process or a Ray task), so
the job it gets carries the region's canonical source and input specs (:meth:`VerifyJob.portable`),
and the worker rebuilds the region with :func:`kopt.agent.region.from_source`, which gives back the
same canonical graph (the worker checks that the signature matches before verifying; rebuilt regions
are kept per process). A region's FX nodes point into the whole captured graph, so they are never
shipped; run in this process, a job uses the region object itself.

Whatever goes wrong in the worker itself (not in the candidate's sandbox child, which the verifier
already turns into a rejection) comes back as ``error``: the loop records the candidate as an error
with that reason and goes on.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Sequence

from kopt.agent.candidate import Candidate
from kopt.agent.region import Region, TensorSpec, from_source
from kopt.agent.verify import Verdict, VerifyConfig, verify


@dataclasses.dataclass(frozen=True)
class VerifyJob:
    """Verify ``candidate`` against its region under ``config``.

    Attributes:
        candidate: what to verify.
        config: the verifier's settings (the worker adds its ``cuda_devices``).
        region: the region object, when the worker shares the proposer's memory; else None.
        region_source, region_inputs, region_model: the region's portable form (filled by
            :meth:`portable`).
    """

    candidate: Candidate
    config: VerifyConfig
    region: Region | None
    region_source: str = ""
    region_inputs: tuple[TensorSpec, ...] = ()
    region_model: str | None = None

    @staticmethod
    def of(region: Region, candidate: Candidate, config: VerifyConfig) -> VerifyJob:
        return VerifyJob(candidate, config, region)

    def portable(self) -> VerifyJob:
        """The same job with the region as source and specs, for a worker in another process."""
        if self.region is None:
            return self
        region = self.region
        return VerifyJob(self.candidate, self.config, None, region.source, tuple(region.inputs), region.model)


@dataclasses.dataclass(frozen=True)
class VerifyEvent:
    """When and where one verification ran, as the worker recorded it (``time.time()`` seconds)."""

    candidate: str  # content hash
    worker: str  # "local-0", "ray-12345" (the Ray worker's process id)
    device: str
    process: int
    started: float
    ended: float


@dataclasses.dataclass(frozen=True)
class VerifyOutcome:
    """The verdict, or the worker's own failure (``error``) when there is none."""

    verdict: Verdict | None
    error: str
    event: VerifyEvent | None  # None when the worker never reported (a Ray worker that died)


_REBUILT: dict[str, Region] = {}
_REBUILT_LOCK = threading.Lock()


def _region(job: VerifyJob) -> Region:
    if job.region is not None:
        return job.region
    signature = job.candidate.region_signature
    with _REBUILT_LOCK:
        region = _REBUILT.get(signature)
    if region is None:
        region = from_source(job.region_source, job.region_inputs, model=job.region_model)
        if region.signature != signature:
            raise ValueError(f"the region rebuilt from its source has signature {region.signature[:12]}, "
                             f"not {signature[:12]} (a different kopt version in the worker?)")
        with _REBUILT_LOCK:
            _REBUILT[signature] = region
    return region


_TRAVELS: dict[str, bool] = {}


def travels(region: Region) -> bool:
    """Whether ``region`` rebuilt from its source has its signature again (checked once per region):
    one that does not is verified inline by the loop, so that a pool never changes an outcome."""
    if region.signature not in _TRAVELS:
        try:
            _TRAVELS[region.signature] = from_source(region.source, region.inputs).signature == region.signature
        except Exception:  # noqa: BLE001 - a region that cannot be rebuilt simply does not travel
            _TRAVELS[region.signature] = False
    return _TRAVELS[region.signature]


def run_job(job: VerifyJob, worker: str, cuda_devices: str | None) -> VerifyOutcome:
    """Verify in this process (the sandbox child is pinned to ``cuda_devices``); never raises."""
    started = time.time()
    config = job.config if cuda_devices is None else dataclasses.replace(
        job.config, cuda_devices=cuda_devices,
        device="cpu" if job.config.device == "cpu" else "cuda:0")  # the one GPU the pinned child sees
    try:
        verdict, error = verify(_region(job), job.candidate, config), ""
    except Exception as failure:  # noqa: BLE001 - a worker's failure is the candidate's record, never the run's end
        verdict, error = None, f"{type(failure).__name__}: {failure}"
    device = "cpu" if cuda_devices is None else f"cuda:{cuda_devices}"
    event = VerifyEvent(job.candidate.content_hash, worker, device, os.getpid(), started, time.time())
    return VerifyOutcome(verdict, error, event)


def most_in_flight(events: Sequence[VerifyEvent]) -> int:
    """The largest number of verifications that were running at one instant (from the recorded
    start and end times: a sweep over the interval ends)."""
    edges = sorted([(e.started, 1) for e in events] + [(e.ended, -1) for e in events], key=lambda x: (x[0], x[1]))
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak
