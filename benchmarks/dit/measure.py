"""Timing, output comparison and memory helpers shared by the benchmark scripts.

On CUDA a call is timed with CUDA events around it (the GPU time of the call, launch gaps
included); on the CPU with ``time.perf_counter``. Every timed call is synchronised so that the
samples are independent and their median is meaningful.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

# the dtypes a benchmark's --dtype names
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call_ms(fn: Callable[[], Any], device: torch.device) -> float:
    """One call's duration in milliseconds: CUDA events on a GPU, perf_counter on the CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        synchronize(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    begin = time.perf_counter()
    fn()
    return (time.perf_counter() - begin) * 1e3


def wall_call_s(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """Wall-clock seconds of one synchronised call (used for the first, compiling call) and its result."""
    synchronize(device)
    begin = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - begin, result


@dataclasses.dataclass
class Timing:
    """First-call wall time and the timed samples after warm-up."""

    first_call_s: float
    samples_ms: list[float]
    first_peak_gb: float | None = None  # peak memory over the first call and the warm-up (compiling)
    peak_gb: float | None = None  # peak memory over the timed calls (steady state)
    sm_clock_mhz: float | None = None  # median SM clock over the timed calls (benchmarks.dit.device_state)
    power_w: float | None = None  # median board power over the timed calls

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def compile_s(self) -> float:
        """First call minus a normal call: what compiling (tracing, codegen, autotuning) cost."""
        return max(0.0, self.first_call_s - self.median_ms / 1e3)


def benchmark(fn: Callable[[], Any], device: torch.device, *, warmup: int,
              repeats: int) -> tuple[Timing, Any]:
    """First call (timed by wall clock), ``warmup`` untimed calls, ``repeats`` timed calls; peak
    memory of the first two phases together (compiling) and of the timed calls (steady state) apart,
    and the GPU's SM clock and power over the timed calls (:mod:`benchmarks.dit.device_state`).

    Returns the timing and the first call's result, which the caller compares with the reference.
    """
    reset_peak_memory(device)
    first_s, result = wall_call_s(fn, device)
    for _ in range(warmup):
        fn()
    synchronize(device)
    first_peak = peak_memory_gb(device)
    reset_peak_memory(device)
    from benchmarks.dit.device_state import DeviceState, nvml_reader

    with DeviceState(nvml_reader(device)) as state:
        samples = [time_call_ms(fn, device) for _ in range(max(1, repeats))]
    return Timing(first_s, samples, first_peak, peak_memory_gb(device), state.sm_clock_mhz, state.power_w), result


def first_tensor(output: Any) -> torch.Tensor:
    """The sample tensor of a diffusers transformer output (tuple with return_dict=False, or .sample)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return first_tensor(output[0])
    if hasattr(output, "sample"):
        return output.sample
    raise TypeError(f"cannot find an output tensor in {type(output).__name__}")


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def compare(candidate: torch.Tensor, reference: torch.Tensor) -> dict[str, float | None]:
    """Relative error ``||c - r|| / ||r||`` and cosine similarity, both computed in float64.

    Non-finite results (NaN/Inf in the candidate) are reported as None so the JSON stays valid.
    """
    c = candidate.detach().reshape(-1).to(torch.float64)
    r = reference.detach().reshape(-1).to(c.device, torch.float64)
    r_norm, c_norm = r.norm().item(), c.norm().item()
    diff = (c - r).norm().item()
    rel_err = diff / r_norm if r_norm > 0 else (0.0 if diff == 0 else math.inf)
    cosine = (c @ r).item() / (c_norm * r_norm) if c_norm > 0 and r_norm > 0 else math.nan
    return {"rel_err": _finite_or_none(rel_err), "cosine": _finite_or_none(cosine)}


def reset_peak_memory(device: torch.device) -> None:
    """Start a fresh peak-memory window (CUDA only)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gb(device: torch.device) -> float | None:
    """``torch.cuda.max_memory_allocated`` in GB (1e9 bytes) since the last reset; None on the CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 1e9


def allocated_gb(device: torch.device) -> float | None:
    """Memory held by tensors right now, for the progress log (spots leaks between variants)."""
    if device.type != "cuda":
        return None
    return torch.cuda.memory_allocated(device) / 1e9


def free_compiled_state(device: torch.device) -> None:
    """Drop dynamo's caches and compiled code, then return freed blocks to the device."""
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
