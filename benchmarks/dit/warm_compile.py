#!/usr/bin/env python3
"""Warm compile time: one variant compiled again in a fresh process, after a run has filled the caches.

    python benchmarks/dit/warm_compile.py --model flux1 --variant kopt --size full

What a second process with the same model and versions pays (a user's next session, a serving
worker restarting): everything in memory is cold (dynamo, kopt's passes, imported kernels), and
what is on disk is warm (Inductor's FX graph and autotune caches, Triton's kernel cache, kopt's
launch-config cache), because the run that spawns this process compiled the same graphs before.

Builds the workload's model with the benchmark's seed, prepares the variant as
``benchmarks/dit/dit.py`` does, and times the first call against a normal call exactly like the
cold row (:class:`benchmarks.dit.measure.Timing`). Prints one JSON line, last:
``{"model", "variant", "compile_s", "first_call_s", "median_ms", "caches", "device_memory", "host"}``
(:func:`cache_counters`, :func:`allocator_activity`, :func:`host_context`).

``--sample N`` samples the thread's stack every 5 ms while it compiles and runs the timed calls
(:mod:`benchmarks.tools.stack_sampler`) and writes the N functions with the most samples, on the
stack and innermost, to stderr: where a warm compile's seconds go (Inductor's cache loads, Triton's
launchers, kopt's passes and checks), at little cost to the compile. ``--profile N`` does the same
with :mod:`cProfile`, which counts calls exactly but charges each one, so Python code of many small
calls (fake tensors, dynamo) looks several times costlier than it is and such a run's ``compile_s``
is not the warm compile time.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import logging
import os
import pstats
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.dit.calls import stepping_forward  # noqa: E402
from benchmarks.dit.measure import DTYPES, benchmark  # noqa: E402
from benchmarks.dit.variants import Setup, select  # noqa: E402
from kopt.workloads import get_workload  # noqa: E402

# Rows that compile nothing: their warm compile time is not a measurement.
NOT_COMPILED = ("eager", "fp8-eager")


def needs_the_device_alone(model: torch.nn.Module, device: torch.device) -> bool:
    """Whether a second copy of ``model`` (the child's) would not fit beside this one on ``device``.

    The child holds the model, one forward's activations and the compiled variant's derived weights
    (FP8 copies before the release); half the device for the model leaves less than that, so above
    40 % of the device's memory the parent makes room. Always False off CUDA (host memory is not the
    limit the tiny models reach)."""
    if device.type != "cuda":
        return False
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    return not two_copies_fit(weights, torch.cuda.get_device_properties(device).total_memory)


def two_copies_fit(weight_bytes: int, device_bytes: int) -> bool:
    """At most 40 % of the device for one copy: see :func:`needs_the_device_alone`."""
    return weight_bytes <= 0.4 * device_bytes


@contextlib.contextmanager
def profiled(top: int) -> Iterator[None]:
    """Profile the block with cProfile when ``top`` > 0; on exit write its ``top`` functions by
    cumulative and by own time to stderr."""
    if top <= 0:
        yield
        return
    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        text = io.StringIO()
        stats = pstats.Stats(profile, stream=text).strip_dirs()
        for order, words in (("cumulative", "cumulative"), ("tottime", "own")):
            text.write(f"\n==== profile: the {top} functions with the most {words} time ====\n")
            stats.sort_stats(order).print_stats(top)
        sys.stderr.write(text.getvalue())


@contextlib.contextmanager
def sampled(top: int) -> Iterator[None]:
    """Sample the block's stack when ``top`` > 0 (:mod:`benchmarks.tools.stack_sampler`); on exit write
    its ``top`` functions by inclusive and by own samples to stderr."""
    if top <= 0:
        yield
        return
    from benchmarks.tools.stack_sampler import StackSampler

    with StackSampler() as sampler:
        yield
    sys.stderr.write("\n==== stack samples ====\n" + sampler.report(top))


def measure(model_name: str, variant_name: str, size: str, device: str, dtype: str,
            profile_top: int = 0, sample_top: int = 0) -> dict[str, Any]:
    """Compile ``variant_name`` on ``model_name`` in this process; the first call's cost and a normal
    call's. ``profile_top`` > 0: under cProfile (:func:`profiled`); ``sample_top`` > 0: with its stack
    sampled (:func:`sampled`)."""
    (variant,) = select(variant_name, size, whole_model=False)
    workload = get_workload(model_name)
    torch.manual_seed(0)
    model = workload.model(size, device=torch.device(device), dtype=DTYPES[dtype])
    inputs = workload.inputs(size, device=torch.device(device), dtype=DTYPES[dtype], seed=0)
    setup = Setup(size=size, device=torch.device(device), dtype=DTYPES[dtype])
    with torch.no_grad():
        # The cold row's process ran eager first (its outputs are the rows' reference), so CUDA, cuBLAS
        # and cuDNN were set up before any compile was timed; here too, or their one-time setup would
        # be counted as warm compile time.
        model(**inputs)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
        free_before = device_free_gb(torch.device(device))
        host = host_context()
        with profiled(profile_top), sampled(sample_top):
            prepared = variant.prepare(model, setup)
            timing, _ = benchmark(stepping_forward(workload, prepared.fn, inputs), torch.device(device),
                                  warmup=1, repeats=3)
    return dict(model=model_name, variant=variant_name, compile_s=timing.compile_s,
                first_call_s=timing.first_call_s, median_ms=timing.median_ms, caches=cache_counters(),
                device_memory=allocator_activity(torch.device(device), free_before), host=host)


# The settings a parent passes to its child that change how a compile runs: caches, threads, debug.
_SETTINGS = ("TORCH", "TRITON", "KOPT", "CUDA", "OMP_", "MKL_", "PYTORCH")


def host_context() -> dict[str, Any]:
    """What this process got from its host and parent: the cores it may run on (an affinity mask is
    inherited, and Inductor sizes its compile pool by it), the load average, the host memory
    available, and the compile-related environment. A child slower than a standalone process with
    the same script shows the difference here."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    available = None
    with contextlib.suppress(OSError, ValueError, StopIteration):
        line = next(row for row in Path("/proc/meminfo").read_text().splitlines() if row.startswith("MemAvailable:"))
        available = round(int(line.split()[1]) / 1e6, 1)
    settings = {k: v for k, v in sorted(os.environ.items()) if k.startswith(_SETTINGS)}
    return {"cores": cores, "load_1min": load, "host_available_gb": available, "settings": settings}


def device_free_gb(device: torch.device) -> float | None:
    """The device's free memory in GB (what other processes leave this one), None off CUDA."""
    if device.type != "cuda":
        return None
    return torch.cuda.mem_get_info(device)[0] / 1e9


def allocator_activity(device: torch.device, free_before_gb: float | None) -> dict[str, float] | None:
    """What the caching allocator had to do during the compile and timed calls: the device's free
    memory when the compile began, device allocations and frees (``cudaMalloc`` / ``cudaFree``) and
    retries after an allocation failed (each one frees every cached block and synchronizes). A warm
    compile that runs short of memory beside another process shows it here. None off CUDA."""
    if device.type != "cuda":
        return None
    stats = torch.cuda.memory_stats(device)
    return {"free_gb_before_compile": round(free_before_gb or 0.0, 2),
            "alloc_retries": stats.get("num_alloc_retries", 0),
            "device_allocs": stats.get("num_device_alloc", 0), "device_frees": stats.get("num_device_free", 0)}


def cache_counters() -> dict[str, int]:
    """Inductor's cache counters of this process (FX graph cache hits, misses and bypasses, autotune
    cache hits...): a warm compile slower than it should be says here whether a cache missed."""
    from torch._dynamo.utils import counters

    return {name: int(count) for name, count in sorted(counters["inductor"].items()) if "cache" in name}


CACHES_NOTE = "warm compile's Inductor caches: "  # how a forward row's notes carry the warm child's counters


def caches_note(caches: dict[str, int]) -> str:
    """The note a forward row keeps of its warm compile's :func:`cache_counters`."""
    return CACHES_NOTE + ", ".join(f"{name} {count}" for name, count in caches.items())


def caches_in_notes(notes: list[str]) -> dict[str, int] | None:
    """The counters :func:`caches_note` wrote into a row's notes; None where the run recorded none."""
    note = next((n for n in notes if n.startswith(CACHES_NOTE)), None)
    if note is None:
        return None
    return {name: int(count) for name, count in (item.rsplit(" ", 1) for item in note[len(CACHES_NOTE):].split(", "))}


def in_fresh_process(model_name: str, variant_name: str, size: str, device: str, dtype: str,
                     timeout_s: float, log: Path | None = None, sample_top: int = 0) -> dict[str, Any]:
    """:func:`measure` in a child process; ``{"error": why}`` if it fails or runs past ``timeout_s``.
    ``log``: where the child's stderr goes (kopt's progress: what the warm compile spent its time on);
    ``sample_top`` > 0: the child samples its stack (``--sample``) and the log ends with where its
    time went."""
    command = [sys.executable, str(Path(__file__).resolve()), "--model", model_name, "--variant", variant_name,
               "--size", size, "--device", device, "--dtype", dtype]
    if sample_top > 0:
        command += ["--sample", str(sample_top)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as timed_out:
        _write_log(log, timed_out.stderr)
        return {"error": f"no result within {timeout_s:.0f} s"}
    _write_log(log, done.stderr)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        return {"error": f"exit {done.returncode}: {tail}"}
    return json.loads(lines[-1])


def _write_log(path: Path | None, text: str | bytes | None) -> None:
    if path is not None:
        path.write_text(text.decode(errors="replace") if isinstance(text, bytes) else (text or ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--variant", required=True)
    parser.add_argument("--size", choices=["tiny", "full"], default="full")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile with cProfile and write the N costliest functions to stderr "
                             "(slows the compile: its compile_s is not the warm time)")
    parser.add_argument("--sample", type=int, default=0, metavar="N",
                        help="sample the stack every 5 ms and write the N functions with the most samples "
                             "to stderr (little overhead: where the warm compile's wall time goes)")
    args = parser.parse_args(argv)
    # kopt's progress (each pass, lowering, tuning) on stderr, timed from the process's start: the
    # parent keeps it as log-warm-<model>-<variant>.txt
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[+%(relativeCreated)7.0f ms] %(name)s: %(message)s"))
    kopt_log = logging.getLogger("kopt")
    kopt_log.setLevel(logging.INFO)
    kopt_log.addHandler(handler)
    result = measure(args.model, args.variant, args.size, args.device, args.dtype, profile_top=args.profile,
                     sample_top=args.sample)
    if args.profile:
        result["profiled"] = True  # compile_s includes the profiler's overhead
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
