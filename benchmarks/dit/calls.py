"""How the harness calls a model for each timed row: a denoising step per call, a CFG pair per call,
or the same timestep every call (a memo hit for kopt's step-invariant stage)."""

from __future__ import annotations

import itertools
from typing import Any

import torch

from kopt.workloads import Workload
from kopt.workloads.base import step_factor


def stepping_forward(workload: Workload, fn: Any, inputs: dict[str, Any]) -> Any:
    """One forward per call at denoising step 0, 1, 2, ... (``Workload.at_step``).

    The first call uses the reference inputs (its output is compared with the references); later calls
    must not repeat a timestep value, or kopt's step-invariant memo would hit on every timed call
    and the forward row would measure a cache instead of a denoising step.
    """
    steps = itertools.count()
    return lambda: fn(**workload.at_step(inputs, next(steps)))


def stepping_cfg_pair(workload: Workload, fn: Any, cond: dict[str, Any], uncond: dict[str, Any]) -> Any:
    """One CFG pair per call, each at a new timestep value that both halves share."""
    steps = itertools.count()
    return lambda: workload.cfg_pair(fn, cond, uncond, t=500.0 * step_factor(next(steps)))


def repeating_forward(fn: Any, inputs: dict[str, Any]) -> Any:
    """Every call at the same timestep value (a fresh tensor each time, as a pipeline makes it).

    For a kopt variant with staging this is the second call of a CFG pair in isolation: after the
    first call every call hits the step-invariant memo. Timed in the same process as the stepping
    ``forward`` row, so the two rows give a memo miss against a memo hit of one compiled program.
    """
    return lambda: fn(**{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})
