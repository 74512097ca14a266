"""Programmatic dependent launch (Hopper and later): a kernel's launch overlaps the end of the
kernel before it.

Why: in a DiT forward replayed from a CUDA graph, the GPU sits idle for a few microseconds
between consecutive kernels (the launch of the next grid after the previous one drains), which
adds up over the thousand-odd kernels of a forward (``benchmarks/dit/breakdown.py`` reports it per
launch). With PDL a kernel launched with the programmatic-serialization attribute may start as
soon as every program of the previous kernel has signalled ``griddepcontrol.launch_dependents``;
it then waits in ``griddepcontrol.wait`` until that kernel has completed and its memory is
visible, so the launch latency hides under the previous kernel's tail.

Valid because every kopt kernel calls :func:`begin` before anything else: it first waits for the
previous kernel (so no input is read early, and by induction every earlier kernel is complete
too), then lets the next one launch. A kernel not launched with the attribute (cuBLAS, Inductor's)
is ordered as usual. ``KOPT_PDL=0`` turns it off; it is off on the CPU interpreter and before sm_90.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kopt.kernels._fastmath import fast_math

__all__ = ["begin", "enabled", "launch_options"]


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(device: torch.device) -> bool:
    """Whether kernels on ``device`` are launched with PDL: an sm_90+ CUDA GPU, not interpreted, ``KOPT_PDL`` not 0."""
    if os.environ.get("KOPT_PDL", "1").strip() == "0" or not fast_math(device):
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


def launch_options(device: torch.device) -> dict[str, bool]:
    """Keyword arguments for ``kernel[grid](...)``: the kernel's ``PDL`` constexpr and Triton's ``launch_pdl``."""
    return {"PDL": True, "launch_pdl": True} if enabled(device) else {"PDL": False}


@triton.jit
def begin(PDL: tl.constexpr):
    """First statement of every kopt kernel: wait for the previous kernel, then let the next launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
