#!/usr/bin/env python3
"""The model zoo on the CPU: eager, torch.compile and kopt against a float64 reference of the same weights.

    python benchmarks/dit/zoo.py                         # every built-in workload, fp32 and bf16
    python benchmarks/dit/zoo.py --models flux1,wan --dtypes bf16

For each tiny workload and dtype: the model is built in that dtype (seed 0) and copied to float64;
one set of fresh random inputs (seeded) is upcast for the copy. The relative error
``||out - ref|| / ||ref||`` of eager (in the dtype), plain ``torch.compile`` (Inductor, whole model)
and ``kopt.compile(passes="auto")`` (Inductor lowering) is measured against the float64 output, with
what kopt's report says: passes that fired, fallbacks, skipped passes, graphs left unrewritten.
``tests/test_zoo.py`` asserts on the same cases, without the torch.compile column unless
``KOPT_ZOO_TORCH_COMPILE=1`` (it is the costliest of the three on the CPU and only widens the bound).
Results: ``<out>/zoo-cpu[-<tag>].{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable from the repo root
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch

import kopt
from kopt.workloads import BUILTIN, Workload, get_workload

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# kopt's error may exceed the larger of eager's and torch.compile's (when measured) by this factor plus FLOOR[dtype]
BOUND_FACTOR = 1.5
# The absolute floor: twice the unit roundoff of the dtype (2**-24 for fp32, 2**-9 for bf16). Any
# result stored in the dtype carries up to one unit roundoff of relative error from its last rounding
# alone, so two correct implementations that round once differently may differ by about two.
FLOOR = {"fp32": 2 * 2.0**-24, "bf16": 2 * 2.0**-9}


@dataclasses.dataclass
class ZooResult:
    """One workload in one dtype: errors against float64 and what kopt did."""

    model: str
    dtype: str
    rel_err_eager: float
    rel_err_torch_compile: float | None  # None: not measured
    rel_err_kopt: float
    bound: float
    passes_fired: dict[str, int]
    graphs: int
    graphs_rewritten: int
    unrewritten: list[str]  # per graph kopt left as it was: why
    fallbacks: list[str]
    skipped_passes: list[str]
    graph_breaks: list[str]
    compile_s_torch_compile: float | None
    compile_s_kopt: float

    @property
    def within_bound(self) -> bool:
        return self.rel_err_kopt <= self.bound

    @property
    def problems(self) -> list[str]:
        """What makes this case fail besides the error bound: kopt did not run what it rewrote."""
        found = [f"fallback: {reason}" for reason in self.fallbacks]
        found += [f"pass {status}" for status in self.skipped_passes]
        if not self.graphs_rewritten:
            found.append("no graph was rewritten: " + "; ".join(self.unrewritten))
        return found


def first_tensor(output: Any) -> torch.Tensor:
    """The model's first output tensor (``return_dict=False`` tuples: the sample, or the logits)."""
    while isinstance(output, (tuple, list)):
        output = output[0]
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"expected a tensor as the first output, got {type(output).__name__}")
    return output


def upcast(value: Any) -> Any:
    """Floating tensors (also inside tuples, lists and dicts) in float64; everything else unchanged."""
    if isinstance(value, torch.Tensor):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(upcast(v) for v in value)
    if isinstance(value, dict):
        return {k: upcast(v) for k, v in value.items()}
    return value


def rel_err(candidate: torch.Tensor, reference: torch.Tensor) -> float:
    """||candidate - reference|| / ||reference|| in float64 (a NaN or inf anywhere gives inf)."""
    difference = (candidate.double() - reference).norm() / reference.norm()
    value = difference.item()
    return value if value == value else float("inf")


def _timed_first_call(fn: Any, inputs: dict[str, Any]) -> tuple[torch.Tensor, float]:
    start = time.perf_counter()
    out = first_tensor(fn(**inputs))
    return out, time.perf_counter() - start


def _kopt_summary(report: kopt.Report) -> dict[str, Any]:
    order = [record.name for graph in report.graphs[:1] for record in graph.passes]  # the pipeline's order
    fired = {name: report.matches(name) for name in order if report.matches(name)}
    unrewritten = [f"graph {g.index}: " + (g.fallback or "no pass matched") for g in report.graphs
                   if g.fallback or "no rewrite fired" in g.lowering]
    return dict(
        passes_fired=fired,
        graphs=len(report.graphs),
        graphs_rewritten=sum(1 for g in report.graphs if not g.fallback and "no rewrite fired" not in g.lowering),
        unrewritten=unrewritten,
        fallbacks=[f"graph {g.index}: {g.fallback}" for g in report.graphs if g.fallback],
        skipped_passes=[f"{p.name} on graph {g.index}: {p.status}" for g in report.graphs for p in g.passes
                        if p.status.startswith("skipped")],
        graph_breaks=list(report.graph_breaks),
    )


def run_case(workload: Workload | str, dtype: str, *, seed: int = 1, torch_compile: bool = True) -> ZooResult:
    """Eager, torch.compile (unless ``torch_compile`` is False) and kopt on one tiny workload in
    ``dtype`` against its float64 copy.

    Without torch.compile the bound is eager's error alone (times the factor, plus the floor): never
    wider than with it, since the bound takes the larger of the two."""
    workload = get_workload(workload) if isinstance(workload, str) else workload
    torch.manual_seed(0)
    model = workload.model("tiny", dtype=DTYPES[dtype])
    reference_model = copy.deepcopy(model).double()
    inputs = workload.inputs("tiny", dtype=DTYPES[dtype], seed=seed)
    compiled, compile_s = None, None
    with torch.no_grad():
        reference = first_tensor(reference_model(**upcast(inputs)))
        del reference_model
        eager = first_tensor(model(**inputs))
        if torch_compile:
            torch._dynamo.reset()
            compiled, compile_s = _timed_first_call(torch.compile(model), inputs)
        torch._dynamo.reset()
        fast = kopt.compile(model, passes="auto")
        optimized, kopt_s = _timed_first_call(fast, inputs)
        torch._dynamo.reset()
    eager_err, kopt_err = rel_err(eager, reference), rel_err(optimized, reference)
    compile_err = rel_err(compiled, reference) if compiled is not None else None
    widest = max(eager_err, compile_err if compile_err is not None else eager_err)
    return ZooResult(model=workload.name, dtype=dtype, rel_err_eager=eager_err, rel_err_torch_compile=compile_err,
                     rel_err_kopt=kopt_err, bound=BOUND_FACTOR * widest + FLOOR[dtype],
                     compile_s_torch_compile=compile_s, compile_s_kopt=kopt_s, **_kopt_summary(fast.kopt_report))


# ---------------------------------------------------------------- the results table


def markdown(results: Sequence[ZooResult]) -> str:
    from benchmarks.dit.results_io import cell

    lines = ["| model | dtype | eager | torch.compile | kopt | bound | ok | graphs rewritten | passes fired (matches) "
             "| compile s (torch.compile / kopt) | problems |",
             "|---|---|---:|---:|---:|---:|---|---:|---|---:|---|"]
    for r in results:
        fired = ", ".join(f"{name} {count}" for name, count in r.passes_fired.items()) or "none"
        ok = "yes" if r.within_bound and not r.problems else "NO"
        breaks = f" ({len(r.graph_breaks)} break kind)" if r.graph_breaks else ""
        lines.append(f"| {r.model} | {r.dtype} | {r.rel_err_eager:.2e} | {cell(r.rel_err_torch_compile, '.2e')} | "
                     f"{r.rel_err_kopt:.2e} | {r.bound:.2e} | {ok} | {r.graphs_rewritten}/{r.graphs}{breaks} | "
                     f"{fired} | {cell(r.compile_s_torch_compile, '.1f')} / {r.compile_s_kopt:.1f} | "
                     f"{'; '.join(r.problems)} |")
    return "\n".join(lines)


def _compile_totals(results: Sequence[ZooResult]) -> str:
    """The compile seconds of each column, summed (torch.compile's over the cases that measured it)."""
    measured = [r.compile_s_torch_compile for r in results if r.compile_s_torch_compile is not None]
    baseline = f"torch.compile {sum(measured):.0f} s over {len(measured)} cases" if measured else "no torch.compile"
    return f"in all: {baseline}, kopt {sum(r.compile_s_kopt for r in results):.0f} s over {len(results)} cases"


def write(results: Sequence[ZooResult], out: Path, tag: str | None, seconds: float,
          meta: dict[str, Any] | None = None) -> Path:
    """``<out>/zoo-cpu[-<tag>].{json,md}``; ``meta`` defaults to this run's (commit, versions, command)."""
    from benchmarks.dit import results_io

    out.mkdir(parents=True, exist_ok=True)
    stem = out / ("zoo-cpu" + (f"-{tag}" if tag else ""))
    meta = meta or results_io.run_metadata(torch.device("cpu"))
    record = dict(meta=meta, bound_factor=BOUND_FACTOR, floor=FLOOR, total_seconds=seconds,
                  rows=[{**dataclasses.asdict(r), "within_bound": r.within_bound, "problems": r.problems}
                        for r in results])
    stem.with_suffix(".json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    dirty = " (uncommitted changes)" if meta.get("git_dirty") else ""
    header = (f"# Zoo on the CPU: relative error against a float64 copy of the same weights\n\n"
              f"Commit {meta.get('git_commit')}{dirty}, torch {meta.get('torch')}, diffusers {meta.get('diffusers')}, "
              f"{meta.get('date')}: `{meta.get('command')}`. Tiny configurations, one call each, fresh random "
              f"inputs (seeded). kopt passes when its error <= {BOUND_FACTOR} x max(eager, torch.compile) + floor "
              f"(torch.compile: where measured; '–' where not) "
              f"(fp32 {FLOOR['fp32']:.1e}, bf16 {FLOOR['bf16']:.1e}) and it ran its rewritten graph (no fallback, "
              f"no skipped pass). Compile seconds are wall time on a shared 2-core machine "
              f"({_compile_totals(results)}). Total {seconds:.0f} s.\n\n")
    stem.with_suffix(".md").write_text(header + markdown(results) + "\n")
    return stem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(BUILTIN), help="comma-separated workload names")
    parser.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16")
    parser.add_argument("--seed", type=int, default=1, help="seed of the inputs (weights: seed 0)")
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    parser.add_argument("--tag", default=None, help="suffix for the output file names")
    parser.add_argument("--no-torch-compile", action="store_true",
                        help="skip the torch.compile column (the bound is then eager's error alone)")
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else Path(__file__).resolve().parents[1] / "results"
    results: list[ZooResult] = []
    start = time.perf_counter()
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        for dtype in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
            result = run_case(name, dtype, seed=args.seed, torch_compile=not args.no_torch_compile)
            results.append(result)
            print(markdown([result]).splitlines()[-1], flush=True)
            write(results, out, args.tag, time.perf_counter() - start)
    stem = write(results, out, args.tag, time.perf_counter() - start)
    print(f"\n{markdown(results)}\n\nwrote {stem}.json and .md ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
