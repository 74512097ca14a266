"""Which workers verify candidates, and on which device each one's sandbox children run.

One worker per visible GPU by default, because a verification may initialize CUDA and two on one
GPU would compete for it. The GPU the end-to-end timing runs on gets no worker when there are two
or more GPUs: timing and verification on the same GPU would perturb the timing. With one GPU, or
timing on the CPU (the sandbox's trials run on CPU cores, so any worker competes with it), the
default is a single worker sharing the timing device, which the loop runs inline, exactly as it did
before the pool existed. ``--workers N`` asks for N workers anyway (on the CPU, or spread
round-robin over the worker GPUs).
"""

from __future__ import annotations

import dataclasses
import os

AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class WorkerSlot:
    """One worker: its index and the ``CUDA_VISIBLE_DEVICES`` its sandbox children get.

    Attributes:
        index: 0.. in the pool.
        cuda_devices: the physical GPU (an entry of the parent's ``CUDA_VISIBLE_DEVICES``, or its
            ordinal), or None for a CPU worker (children left as they are today).
        shares_timing_device: the worker competes with the end-to-end timing: it runs on the timing
            GPU, or the timing runs on the CPU (where every verification's trials run).
    """

    index: int
    cuda_devices: str | None
    shares_timing_device: bool

    @property
    def device(self) -> str:
        return "cpu" if self.cuda_devices is None else f"cuda (CUDA_VISIBLE_DEVICES={self.cuda_devices})"


def visible_gpus(count: int | None = None) -> list[str]:
    """The physical names of the GPUs this process sees, in torch's ordinal order: the entries of
    ``CUDA_VISIBLE_DEVICES`` when it is set (a child given one of them sees exactly that GPU), else
    ``0..count-1`` (``count``: ``torch.cuda.device_count()`` by default)."""
    if count is None:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    listed = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    if "CUDA_VISIBLE_DEVICES" in os.environ and len(listed) >= count:
        return listed[:count]
    return [str(i) for i in range(count)]


def plan_workers(requested: int | str, gpus: list[str], timing_gpu: int | None) -> tuple[WorkerSlot, ...]:
    """The pool's workers for ``requested`` (``"auto"`` or a count), the visible ``gpus`` (physical
    names by ordinal) and the ordinal of the GPU the timing runs on (None: timing on the CPU)."""
    if requested != AUTO and (not isinstance(requested, int) or requested < 1):
        raise ValueError(f"workers must be 'auto' or a positive integer, got {requested!r}")
    if not gpus or (timing_gpu is None and requested == AUTO):
        count = 1 if requested == AUTO else requested
        return tuple(WorkerSlot(i, None, True) for i in range(count))
    free = [k for k in range(len(gpus)) if k != timing_gpu] if len(gpus) >= 2 else [0]
    count = len(free) if requested == AUTO else requested
    chosen = [free[i % len(free)] for i in range(count)]
    return tuple(WorkerSlot(i, gpus[k], timing_gpu is None or k == timing_gpu) for i, k in enumerate(chosen))


def parse_workers(text: str) -> int | str:
    """``--workers`` on the command line: ``auto`` or a positive integer."""
    if text == AUTO:
        return AUTO
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"--workers takes 'auto' or a positive integer, not {text!r}") from None
    if value < 1:
        raise ValueError(f"--workers must be at least 1, got {value}")
    return value
