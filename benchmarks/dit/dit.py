#!/usr/bin/env python3
"""DiT benchmark: eager vs torch.compile vs FP8 baseline vs kopt on Qwen-Image and FLUX.2.

    python benchmarks/dit/dit.py --size full --models qwen-image          # one H200, one model per process
    python benchmarks/dit/dit.py --size tiny                              # CPU smoke run (timings mean nothing)

For each model (full size: published config, random weights, built directly in bf16 on the GPU;
batch 1, at the published resolution: kopt/workloads/<model>.py) and each variant, one transformer forward is
timed (CUDA events, median of ``--repeats`` after ``--warmup``), with compile time (first call
minus a normal call; on a GPU after one tiny Inductor compile, so that the process's one-time start-up
is charged to no variant: :mod:`benchmarks.dit.process_warmup`), peak memory, and relative error /
cosine in float64 against a higher-precision
reference of the same weights (``kopt.reference``: fp32 on a GPU, fp64 on the CPU; eager's own row
says how far eager bf16 is from it) and against eager (``*_vs_eager``). Eager,
torch.compile and kopt also get a CFG-pair row (conditional + unconditional call, fresh timestep
tensor per call). A profiler breakdown (GEMM / attention / norm+elementwise / copies / other,
launches per forward) is taken per variant, and the hardware ceilings and per-model floors are
measured in the same run. Results: ``<out>/dit-<size>-<models>.{json,md,png}``, rewritten after
every variant so a run killed at the device time limit keeps what it finished. See README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable from the repo root.
    # Appended, not prepended, so an installed kopt (with kopt.kernels mapped from kernels/) wins
    # over the bare source folder of the same name.
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch

from benchmarks.dit import results_io
from benchmarks.dit.breakdown import profile_breakdown
from benchmarks.dit.calls import repeating_forward, stepping_cfg_pair, stepping_forward
from benchmarks.dit.ceilings import count_flops, floors, measure_ceilings
from benchmarks.dit.log import Log
from benchmarks.dit.measure import (
    DTYPES,
    allocated_gb,
    benchmark,
    compare,
    first_tensor,
    free_compiled_state,
    synchronize,
)
from benchmarks.dit.process_warmup import warm_up_process
from benchmarks.dit.variants import Prepared, Setup, Variant, all_variants, select
from benchmarks.dit.warm_compile import NOT_COMPILED, caches_note, in_fresh_process, needs_the_device_alone
from kopt.kernels import _autotune
from kopt.reference import ReferenceStats, reference_forward
from kopt.workloads import Workload, get_workload


@dataclasses.dataclass
class Run:
    """Resolved options plus the results being accumulated (written after every variant)."""

    args: argparse.Namespace
    setup: Setup
    variants: list[Variant]
    log: Log
    results: dict[str, Any]
    pace: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # (estimated, taken) s per variant

    @property
    def device(self) -> torch.device:
        return self.setup.device

    def save(self, png: bool = False, pending: list[dict[str, Any]] | None = None) -> None:
        """Rewrite the JSON/markdown (and PNG); ``pending`` rows of the running variant are included."""
        name = results_io.stem(self.setup.size, self.results["models"], self.args.tag)
        results = {**self.results, "rows": self.results["rows"] + (pending or [])}
        for note in results_io.write_all(results, Path(self.args.out), name, png=png):
            self.log(note)
        if _autotune.TUNER.path.exists():  # the launch configs the kernels chose, with every candidate's time
            shutil.copyfile(_autotune.TUNER.path, Path(self.args.out) / f"{name}.autotune.json")


# ---------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    names = ", ".join(v.name for v in all_variants())
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "full"], default=None,
                        help="full (default on CUDA) or tiny (default on CPU: smoke test)")
    parser.add_argument("--models", default="qwen-image,flux2", help="comma-separated workload names")
    parser.add_argument("--variants", default="auto",
                        help=f"comma-separated, or 'auto' (tiny: all; full: eager, torch.compile, kopt, "
                             f"fp8+torch.compile). Known: {names}")
    parser.add_argument("--whole-model", action="store_true",
                        help="add whole-model torch.compile (off by default at full size: slow to compile)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per row (median reported)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls after the first, compiling one")
    parser.add_argument("--profile-forwards", type=int, default=3,
                        help="forwards under torch.profiler per variant for the breakdown (0: skip)")
    parser.add_argument("--no-ceilings", action="store_true", help="skip the copy/matmul ceilings")
    parser.add_argument("--budget-s", type=float, default=540.0,
                        help="skip variants whose estimated time would end the process past this")
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="model dtype (default bf16 on CUDA, fp32 on CPU)")
    parser.add_argument("--out", default=None,
                        help="results folder (default: $OUT if set, else benchmarks/results)")
    parser.add_argument("--tag", default=None, help="suffix for the output file names")
    parser.add_argument("--trace", action="store_true",
                        help="write each profiled forward as a gzipped Chrome trace "
                        "(trace-<model>-<variant>-<call>.json.gz)")
    parser.add_argument("--warm-compile", nargs="?", const="all", default=None, metavar="VARIANTS",
                        help="after each compiled variant (or only those named, comma-separated), compile it "
                             "again in a fresh process (warm caches) and record that time as the forward "
                             "row's warm_compile_s")
    parser.add_argument("--warm-sample", type=int, default=0, metavar="N",
                        help="with --warm-compile: the child samples its stack every 5 ms and its log "
                             "(log-warm-<model>-<variant>-<tag>.txt) ends with the N functions with the most "
                             "samples: where a warm compile inside this run spends its time")
    args = parser.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.size = args.size or ("full" if args.device == "cuda" else "tiny")
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    args.out = args.out or os.environ.get("OUT") or str(results_io.REPO / "benchmarks" / "results")
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    return args


# ---------------------------------------------------------------- one row


def _empty_row(model: str, variant: str, call: str, status: str = "ok") -> dict[str, Any]:
    return dict(model=model, variant=variant, call=call, status=status, median_ms=None, compile_s=None,
                warm_compile_s=None, first_call_s=None, samples_ms=[], peak_gb=None, first_call_peak_gb=None,
                sm_clock_mhz=None, power_w=None, rel_err=None, cosine=None,
                rel_err_vs_eager=None, cosine_vs_eager=None, launches=None, replay=None, notes=[])


def _as_output(call: str, result: Any) -> torch.Tensor:
    """The tensor compared with the reference: the sample, or both CFG samples stacked."""
    if call == "cfg-pair":
        return torch.stack([first_tensor(result[0]), first_tensor(result[1])])
    return first_tensor(result)


def measure_row(run: Run, model: str, variant: str, call: str, fn: Any,
                reference: torch.Tensor, eager: torch.Tensor) -> dict[str, Any]:
    """Time ``fn`` (first call compiles), compare its output with the higher-precision ``reference``
    and with ``eager``'s output, note peak memory (steady state, and while compiling)."""
    timing, result = benchmark(fn, run.device, warmup=run.args.warmup, repeats=run.args.repeats)
    row = _empty_row(model, variant, call)
    output = _as_output(call, result)
    row.update(compare(output, reference))
    row.update({f"{key}_vs_eager": value for key, value in compare(output, eager).items()})
    row.update(median_ms=timing.median_ms, compile_s=timing.compile_s, first_call_s=timing.first_call_s,
               samples_ms=[round(s, 4) for s in timing.samples_ms], peak_gb=timing.peak_gb,
               first_call_peak_gb=timing.first_peak_gb, sm_clock_mhz=timing.sm_clock_mhz, power_w=timing.power_w)
    run.log(f"  {model} {variant} {call}: median {timing.median_ms:.3f} ms, compile {timing.compile_s:.1f} s, "
            f"vs reference rel_err {row['rel_err']} cosine {row['cosine']}, vs eager rel_err "
            f"{row['rel_err_vs_eager']} cosine {row['cosine_vs_eager']}, peak {row['peak_gb']} GB "
            f"(first calls {row['first_call_peak_gb']} GB)"
            + (f", SM {timing.sm_clock_mhz:.0f} MHz at {timing.power_w:.0f} W" if timing.sm_clock_mhz else ""))
    return row


# ---------------------------------------------------------------- one variant


@dataclasses.dataclass
class ModelState:
    """Per model: the workload, the shared model, inputs, the higher-precision references and eager's
    outputs (forward and CFG pair)."""

    name: str
    workload: Workload
    model: torch.nn.Module
    inputs: dict[str, Any]
    negative: dict[str, Any]
    reference: torch.Tensor
    reference_cfg: torch.Tensor
    eager: torch.Tensor
    eager_cfg: torch.Tensor
    fingerprint: torch.Tensor  # per-parameter sums: a rebuilt model must match them exactly


def replay_status(prepared: Prepared) -> str | None:
    """Whether the timed calls replayed a CUDA graph: a baseline's whole-forward replay, or kopt's own
    (every per-step graph replayed its last call); None for variants that do not replay."""
    if prepared.replay is not None:
        return prepared.replay()
    report = prepared.kopt_report
    stats = [g.cuda_graphs for g in report.graphs if g.cuda_graphs is not None] if report is not None else []
    if report is not None and report.forward_replay is not None:  # kopt regional: the whole forward
        stats = [report.forward_replay]
    if not stats:
        return None
    reasons = {s.disabled or s.skipped for s in stats} - {None}
    return "replayed" if not reasons else "not replayed: " + "; ".join(sorted(reasons))


def _uses_staging(prepared: Prepared) -> bool:
    """A step-invariant stage with a memo exists (filled in by the first call, which compiles)."""
    report = prepared.kopt_report
    return report is not None and any(g.memo is not None for g in report.graphs)


def _trace_path(run: Run, state: ModelState, variant: Variant, call: str) -> Path | None:
    """Where ``--trace`` writes that row's profile (None without ``--trace``)."""
    if not run.args.trace:
        return None
    return Path(run.args.out) / f"trace-{state.name}-{variant.name}-{call}.json.gz".replace("+", "_")


def _measure_variant(run: Run, state: ModelState, variant: Variant, prepared: Prepared,
                     rows: list[dict[str, Any]]) -> None:
    """Forward row, profiler breakdown, CFG-pair row, kopt report; appends rows as they finish."""
    fn = prepared.fn
    forward = measure_row(run, state.name, variant.name, "forward",
                          stepping_forward(state.workload, fn, state.inputs), state.reference, state.eager)
    forward["notes"] = list(prepared.notes)
    forward["replay"] = replay_status(prepared)
    rows.append(forward)
    # the memo hit right after the forward: the two rows compare one compiled program's miss and hit, so
    # no other row's load (a CFG pair at the card's power limit) may heat the card between them
    hit = _measure_memo_hit(run, state, variant, prepared) if _uses_staging(prepared) else None
    if run.args.profile_forwards > 0:
        breakdown = profile_breakdown(stepping_forward(state.workload, fn, state.inputs), run.device,
                                      run.args.profile_forwards, trace=_trace_path(run, state, variant, "forward"))
        gap = forward["median_ms"] - breakdown["kernel_ms"] if run.device.type == "cuda" else None
        run.results["breakdown"].append({"model": state.name, "variant": variant.name, "call": "forward",
                                         "gap_ms": gap, **breakdown})
        forward["launches"] = breakdown["launches"]
    run.save(pending=rows)  # the forward row survives a time-out during the CFG measurement
    if variant.cfg_pair:
        pair = stepping_cfg_pair(state.workload, fn, state.inputs, state.negative)
        cfg = measure_row(run, state.name, variant.name, "cfg-pair", pair, state.reference_cfg, state.eager_cfg)
        cfg["notes"] = list(prepared.notes)
        cfg["replay"] = replay_status(prepared)
        rows.append(cfg)
    if hit is not None:
        rows.append(hit)
    if prepared.kopt_report is not None:
        run.results["kopt_reports"][f"{state.name}/{variant.name}"] = prepared.kopt_report.to_dict()
        run.log(f"kopt report ({state.name}, {variant.name}):\n{prepared.kopt_report}")


def _measure_memo_hit(run: Run, state: ModelState, variant: Variant, prepared: Prepared) -> dict[str, Any]:
    """The forward at the same timestep every call: a step-invariant memo hit of the forward row's program."""
    fn = prepared.fn
    hit = measure_row(run, state.name, variant.name, "forward-memo-hit",
                      repeating_forward(fn, state.inputs), state.reference, state.eager)
    hit["notes"] = list(prepared.notes) + ["same timestep every call: step-invariant memo hit"]
    if run.args.profile_forwards > 0:  # kernel time and launches of a hit: what the cache removes
        breakdown = profile_breakdown(repeating_forward(fn, state.inputs), run.device, run.args.profile_forwards,
                                      trace=_trace_path(run, state, variant, "forward-memo-hit"))
        gap = hit["median_ms"] - breakdown["kernel_ms"] if run.device.type == "cuda" else None
        run.results["breakdown"].append({"model": state.name, "variant": variant.name, "call": "forward-memo-hit",
                                         "gap_ms": gap, **breakdown})
        hit["launches"] = breakdown["launches"]
    return hit


def run_variant(run: Run, state: ModelState, variant: Variant) -> None:
    """Prepare and measure one variant; always undo it and free its compiled state afterwards."""
    prepared: Prepared | None = None
    rows: list[dict[str, Any]] = []
    try:
        start = time.perf_counter()
        tuned_before = dict(_autotune.TUNER.sources)
        prepared = variant.prepare(state.model, run.setup)
        prepare_s = time.perf_counter() - start
        if prepare_s >= 0.1:  # e.g. FP8 weight quantization; kopt and torch.compile are lazy
            prepared.notes.append(f"prepare {prepare_s:.1f} s")
        _measure_variant(run, state, variant, prepared, rows)
        launch_configs = {k: v - tuned_before.get(k, 0) for k, v in _autotune.TUNER.sources.items()}
        if any(launch_configs.values()) and rows:  # what the cold compile timed, and what it reused
            rows[0]["notes"].append("kernel launch configs: " + ", ".join(
                f"{n} {source}" for source, n in sorted(launch_configs.items()) if n))
    except Exception as error:  # noqa: BLE001 - one failing variant must not lose the others
        run.log(f"  {variant.name} FAILED: {type(error).__name__}: {error}")
        traceback.print_exc()
        message = str(error).splitlines()[0][:200] if str(error) else ""
        status = f"error: {type(error).__name__}: {message}"
        calls = ["forward", "cfg-pair"] if variant.cfg_pair else ["forward"]
        rows += [_empty_row(state.name, variant.name, c, status) for c in calls[len(rows):]]
    finally:
        if prepared is not None:
            prepared.undo()
        prepared = None  # drop the compiled module before freeing caches
        free_compiled_state(run.device)
    run.results["rows"] += rows
    run.log(f"  freed {variant.name}; allocated now {allocated_gb(run.device)} GB")


def wants_warm_compile(selection: str | None, variant: str) -> bool:
    """Whether ``--warm-compile`` (None: off, "all", or a comma-separated list) asks for ``variant``."""
    if selection is None or variant in NOT_COMPILED:
        return False
    return selection == "all" or variant in {v.strip() for v in selection.split(",")}


def measure_warm_compile(run: Run, state: ModelState, variant: Variant) -> ModelState:
    """The variant compiled again in a fresh process (:mod:`benchmarks.dit.warm_compile`): its compile
    time with the disk caches this run filled goes into the forward row as ``warm_compile_s``.

    The child builds its own copy of the model. Where two copies would not fit on the device
    (:func:`benchmarks.dit.warm_compile.needs_the_device_alone`: FLUX.2's 64 GB on a 141 GB H200),
    this process drops its copy first and builds it again from the seed afterwards."""
    name = state.name
    forward = next((r for r in run.results["rows"] if r["model"] == name and r["variant"] == variant.name
                    and r["call"] == "forward"), None)
    if forward is None or forward["status"] != "ok":
        return state
    left = run.args.budget_s - run.log.elapsed()
    if left < 60:
        forward["notes"].append("warm compile not measured: budget")
        return state
    alone = needs_the_device_alone(state.model, run.device)
    if alone:
        run.log(f"  {name}: two copies of the model do not fit on the device; this process drops its own "
                "while the warm compile runs")
        state.model = None  # type: ignore[assignment]
        free_compiled_state(run.device)
    log = Path(run.args.out) / f"log-warm-{name}-{variant.name}{'-' + run.args.tag if run.args.tag else ''}.txt"
    result = in_fresh_process(name, variant.name, run.setup.size, str(run.device), run.args.dtype, timeout_s=left,
                              log=log, sample_top=run.args.warm_sample)
    if alone:
        state = rebuild_model(run, state, why="after the warm compile")
    if "error" in result:
        forward["notes"].append(f"warm compile failed: {result['error']}")
        run.log(f"  {name} {variant.name} warm compile failed: {result['error']}")
        return state
    forward["warm_compile_s"] = result["compile_s"]
    caches = result.get("caches") or {}
    if caches:
        forward["notes"].append(caches_note(caches))
    memory = result.get("device_memory")
    if memory:
        forward["notes"].append("warm compile's device memory: " + ", ".join(f"{k} {v}" for k, v in memory.items()))
    host = result.get("host")
    if host:
        forward["notes"].append(f"warm compile's host: {host['cores']} cores, load {host['load_1min']}, "
                                f"{host['host_available_gb']} GB available, settings {host['settings']}")
    if run.args.warm_sample > 0:
        forward["notes"].append(f"warm compile sampled (stack every 5 ms): {log.name}")
    run.log(f"  {name} {variant.name} warm compile (fresh process, warm disk caches): {result['compile_s']:.1f} s"
            + (f"; Inductor caches: {caches}" if caches else ""))
    return state


def pace_factor(pace: list[tuple[float, float]]) -> float:
    """How long this run's variants took against their full-size estimates (1 before any ran; kept
    within [0.1, 3]): the estimates are written for the largest models, and a smaller one (a 2B
    video DiT against a 20B image DiT) should not have its variants skipped on their account."""
    estimated = sum(e for e, _ in pace)
    if not pace or estimated <= 0:
        return 1.0
    return min(3.0, max(0.1, sum(t for _, t in pace) / estimated))


def over_budget(run: Run, variant: Variant) -> str | None:
    """Why ``variant`` is skipped (None to run it): elapsed + its full-size estimate, scaled by this
    run's pace (:func:`pace_factor`), > --budget-s."""
    estimate = variant.estimate_full_s * pace_factor(run.pace) if run.setup.size == "full" else 0.0
    elapsed = run.log.elapsed()
    if elapsed + estimate > run.args.budget_s:
        return (f"skipped: budget (elapsed {elapsed:.0f} s + estimated {estimate:.0f} s "
                f"> --budget-s {run.args.budget_s:.0f})")
    return None


# ---------------------------------------------------------------- one model


def build_state(run: Run, name: str) -> ModelState:
    """Build the model once, its inputs, eager's outputs and the higher-precision references (forward
    and CFG pair): the same weights, each op in float32 on a GPU (float64 on the CPU), weights upcast
    op by op so that no upcast copy of the model is needed (``kopt.reference``)."""
    workload = get_workload(name)
    size, device, dtype = run.setup.size, run.device, run.setup.dtype
    torch.manual_seed(0)
    model = workload.model(size, device=device, dtype=dtype)
    params = sum(p.numel() for p in model.parameters())
    run.log(f"built {name} ({size}): {params / 1e6:.1f} M parameters, allocated {allocated_gb(device)} GB")
    fingerprint = weights_fingerprint(model)
    inputs = workload.inputs(size, device=device, dtype=dtype, seed=0)
    negative = workload.inputs(size, device=device, dtype=dtype, seed=1, negative=True)
    eager = first_tensor(model(**inputs)).clone()
    cond, uncond = workload.cfg_pair(model, inputs, negative)
    eager_cfg = torch.stack([first_tensor(cond), first_tensor(uncond)]).clone()
    start = time.perf_counter()
    stats = ReferenceStats()
    reference = first_tensor(reference_forward(model, **inputs, stats=stats))
    synchronize(device)
    reference_s = time.perf_counter() - start
    cond, uncond = workload.cfg_pair(lambda **kw: reference_forward(model, **kw), inputs, negative)
    reference_cfg = torch.stack([first_tensor(cond), first_tensor(uncond)])
    info = {"parameters": params, "output_shape": list(eager.shape),
            "reference": {"dtype": str(reference.dtype).removeprefix("torch."), "forward_s": round(reference_s, 3),
                          "peak_upcast_gb": stats.peak_live_bytes / 1e9},
            "eager_vs_reference": compare(eager, reference)}
    run.results["per_model"][name] = info
    run.log(f"{name}: reference forward ({info['reference']['dtype']}) {reference_s:.2f} s, peak upcast copies "
            f"{stats.peak_live_bytes / 1e9:.3f} GB; eager vs reference {info['eager_vs_reference']}")
    return ModelState(name, workload, model, inputs, negative, reference, reference_cfg, eager, eager_cfg, fingerprint)


def weights_fingerprint(model: torch.nn.Module) -> torch.Tensor:
    """Each parameter's sum, in float64 on the host: equal for two builds from one seed, or not the same model."""
    with torch.no_grad():
        return torch.stack([p.detach().double().sum() for p in model.parameters()]).cpu()


def rebuild_model(run: Run, state: ModelState, why: str = "for the next model-changing variant") -> ModelState:
    """The model built again from the same seed, after a variant changed or released its weights (FP8,
    as kopt's FP8 does by default): the references and eager outputs stay valid because the weights are
    the same, which the fingerprint checks."""
    state.model = None  # type: ignore[assignment]  # free the old weights before building the new ones
    free_compiled_state(run.device)
    torch.manual_seed(0)
    start = time.perf_counter()
    model = state.workload.model(run.setup.size, device=run.device, dtype=run.setup.dtype)
    if not torch.equal(weights_fingerprint(model), state.fingerprint):
        raise RuntimeError(f"{state.name} built again from seed 0 has other weights: its references do not apply")
    run.log(f"{state.name}: built again {why} in {time.perf_counter() - start:.1f} s, "
            f"allocated {allocated_gb(run.device)} GB")
    return dataclasses.replace(state, model=model)


def _count_flops(run: Run, state: ModelState) -> dict[str, Any] | None:
    """FLOPs of one eager forward; None (logged) if counting fails: the timings matter more."""
    try:
        flops = count_flops(state.model, state.inputs)
    except Exception as error:  # noqa: BLE001
        run.log(f"{state.name}: FLOP counting failed: {type(error).__name__}: {error}")
        return None
    run.log(f"{state.name}: {flops['total'] / 1e12:.4f} TFLOP per forward (GEMM {flops['gemm'] / 1e12:.4f}, "
            f"attention {flops['attention'] / 1e12:.4f}; by op {flops['by_op']})")
    return flops


def run_model(run: Run, name: str) -> None:
    """Build ``name`` once, count its FLOPs, run every selected variant on it, then its floor."""
    state = build_state(run, name)
    info = run.results["per_model"][name]
    info["flops"] = _count_flops(run, state)
    changed = False  # a variant changed or released the model's weights
    for variant in run.variants:
        skipped = over_budget(run, variant)
        if skipped:
            run.log(f"{name} {variant.name}: {skipped}")
            calls = ["forward", "cfg-pair"] if variant.cfg_pair else ["forward"]
            run.results["rows"] += [_empty_row(name, variant.name, c, skipped) for c in calls]
            continue
        run.log(f"{name} {variant.name}: {variant.description}")
        began = run.log.elapsed()
        if variant.mutates_model and changed:
            state = rebuild_model(run, state)
        changed |= variant.mutates_model
        run_variant(run, state, variant)
        if wants_warm_compile(run.args.warm_compile, variant.name):
            before = state
            state = measure_warm_compile(run, state, variant)
            changed &= state is before  # built again from the seed: unchanged
        run.pace.append((variant.estimate_full_s, run.log.elapsed() - began))
        run.save()
    eager = next((b for b in run.results["breakdown"] if b["model"] == name and b["variant"] == "eager"), None)
    attention_ms = eager["ms"]["attention"] if eager and run.device.type == "cuda" else None
    info["floor"] = floors(info["flops"], run.results["ceilings"], attention_ms)
    del state
    free_compiled_state(run.device)


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 <pid>` prints every thread's stack and carries on: where a call is
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    log = Log()
    log.show_kopt_progress()
    device = torch.device(args.device)
    setup = Setup(size=args.size, device=device, dtype=DTYPES[args.dtype])
    variants = select(args.variants, args.size, args.whole_model)
    results: dict[str, Any] = dict(
        size=args.size, models=args.models, variants=[v.name for v in variants], dtype=args.dtype,
        repeats=args.repeats, warmup=args.warmup, meta=results_io.run_metadata(device), rows=[],
        breakdown=[], ceilings=None, per_model={}, kopt_reports={})
    run = Run(args, setup, variants, log, results)
    log(f"dit benchmark: size={args.size} device={device} dtype={args.dtype} models={args.models} "
        f"variants={results['variants']} out={args.out}")
    with torch.no_grad():
        if device.type == "cuda":  # the process's one-time Inductor start-up, charged to no variant
            results["process_warmup_s"] = warm_up_process(device)
            log(f"process warm-up (one tiny Inductor compile: imports, compile workers): "
                f"{results['process_warmup_s']:.1f} s")
        if not args.no_ceilings:
            results["ceilings"] = measure_ceilings(device)
            log(f"ceilings: {results['ceilings']}")
        for name in args.models:
            try:
                run_model(run, name)
            except Exception as error:  # noqa: BLE001 - keep the other model's results
                log(f"{name} FAILED outside a variant: {type(error).__name__}: {error}")
                traceback.print_exc()
                results["per_model"].setdefault(name, {})["error"] = f"{type(error).__name__}: {error}"
            run.save()
    run.save(png=True)
    log(f"wrote {Path(args.out) / results_io.stem(args.size, args.models, args.tag)}.json and .md (.png unless noted)")
    print("\n" + results_io.short_table(results["rows"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
