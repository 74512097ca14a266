"""``kopt demo`` / ``kopt explain``: compile tiny real models on the CPU and show what kopt did."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import kopt
from kopt.reference import reference_forward
from kopt.verify import cosine_similarity, relative_error
from kopt.workloads import get_workload


def _median_seconds(fn: Callable[[int], Any], repeats: int) -> float:
    """Median wall time of ``fn(step)`` over steps 1..repeats (a new timestep value each call)."""
    times = []
    for step in range(1, repeats + 1):
        _synchronize()
        start = time.perf_counter()
        fn(step)
        _synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def placement(size: str) -> tuple[torch.device, torch.dtype]:
    """Where a workload of ``size`` runs: tiny on the CPU in float32, full (billions of parameters) on the
    GPU in bfloat16."""
    if size != "full":
        return torch.device("cpu"), torch.float32
    if not torch.cuda.is_available():
        raise ValueError("size 'full' is the published configuration (billions of parameters): it needs a "
                         "CUDA device; use size 'tiny' on the CPU")
    return torch.device("cuda"), torch.bfloat16


def explain(workload_name: str, *, size: str = "tiny", lower: str = "inductor",
            passes: kopt.passes.pipeline.PassSpec = "auto", seed: int = 0,
            repeats: int = 5, fp8: Any = None, progress: bool | None = None,
            dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Compile one workload, check it on fresh inputs against a higher-precision reference of the
    same weights and against eager, time both.

    ``fp8``: a :class:`kopt.fp8.Fp8Config`, or None; ``progress``: as for :func:`kopt.compile`;
    ``dtype``: the model's and its inputs' (default: float32 on the CPU, bfloat16 at full size on a GPU).
    Returns a dict with the report, the relative error and cosine against the reference
    (``rel_err``, ``cosine``), against eager (``rel_err_vs_eager``, ``cosine_vs_eager``), eager's own
    against the reference (``eager_rel_err``, ``eager_cosine``), the precision hazards found, and
    eager/kopt median seconds.
    """
    workload = get_workload(workload_name)
    device, default_dtype = placement(size)
    dtype = dtype or default_dtype
    torch.manual_seed(seed)
    model = workload.model(size, device=device, dtype=dtype)  # type: ignore[arg-type]
    compiled = kopt.compile(model, passes, lower=lower, verify=True, fp8=fp8, progress=progress)
    with torch.no_grad():
        first = workload.inputs(size, device=device, dtype=dtype, seed=seed + 1)  # type: ignore[arg-type]
        start = time.perf_counter()
        compiled(**first)
        compile_seconds = time.perf_counter() - start
        fresh = workload.inputs(size, device=device, dtype=dtype, seed=seed + 2)  # type: ignore[arg-type]
        eager = model(**fresh)[0]
        reference = reference_forward(model, **fresh)[0]
        output = compiled(**fresh)[0]
        eager_s = _median_seconds(lambda step: model(**workload.at_step(fresh, step)), repeats)
        kopt_s = _median_seconds(lambda step: compiled(**workload.at_step(fresh, step)), repeats)
    report = compiled.kopt_report
    return dict(workload=workload_name, size=size, lower=lower, report=report,
                rel_err=relative_error(output, reference), cosine=cosine_similarity(output, reference),
                rel_err_vs_eager=relative_error(output, eager), cosine_vs_eager=cosine_similarity(output, eager),
                eager_rel_err=relative_error(eager, reference), eager_cosine=cosine_similarity(eager, reference),
                hazards=[dataclasses.asdict(h) for graph in report.graphs for h in graph.hazards],
                compile_s=compile_seconds, eager_ms=eager_s * 1e3, kopt_ms=kopt_s * 1e3)


def summary_line(result: dict[str, Any]) -> str:
    hazards = f"  {len(result['hazards'])} precision hazard(s)" if result.get("hazards") else ""
    return (f"{result['workload']:<11} vs reference: kopt rel_err {result['rel_err']:.2e} cos {result['cosine']:.6f}, "
            f"eager rel_err {result['eager_rel_err']:.2e}; kopt vs eager rel_err {result['rel_err_vs_eager']:.2e}  "
            f"eager {result['eager_ms']:.2f} ms  kopt {result['kopt_ms']:.2f} ms  "
            f"(first call incl. compile {result['compile_s']:.1f} s){hazards}")
