"""Writing results: JSON (the record), a markdown table (for people), a PNG bar chart (optional).

Files are named ``dit-<size>-<models>[-<tag>].{json,md,png}`` so that separate per-model device
calls do not overwrite each other. Everything is rewritten after each variant, so a run killed by a
time limit still leaves the rows it finished.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import torch

from benchmarks.dit.summary import peak_gb, summary_rows, summary_table

REPO = Path(__file__).resolve().parents[2]


FULL_INPUTS = "batch 1, each model at its published resolution (inputs: kopt/workloads/<model>.py)"

def _version(package: str) -> str | None:
    try:
        return importlib_metadata.version(package)
    except importlib_metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def run_metadata(device: torch.device) -> dict[str, Any]:
    """Who/what/when: device name, library versions, date, git commit (+dirty flag), command line."""
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "device_type": device.type,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "diffusers": _version("diffusers"),
        "kopt": _version("kopt"),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        # The device machine's copy may carry no .git, or a stale one: KOPT_COMMIT, when the caller
        # passes it, names the tree that actually ran and wins over whatever git says there.
        "git_commit": os.environ.get("KOPT_COMMIT") or _git("rev-parse", "HEAD"),
        "git_dirty": None if dirty is None or os.environ.get("KOPT_COMMIT") else bool(dirty),
        "command": " ".join(sys.argv),
    }


def stem(size: str, models: Sequence[str], tag: str | None = None) -> str:
    """``dit-full-qwen-image``, ``dit-tiny-qwen-image+flux2``, ``dit-full-flux2-fp8`` (with a tag)."""
    return "-".join(["dit", size, "+".join(models), *([tag] if tag else [])])


def _clean(value: Any) -> Any:
    """JSON-safe: non-finite floats become null (JSON has no NaN), objects become strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def with_speedups(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows plus ``speedup_vs_eager``: eager's median over this row's, same model and call."""
    eager = {(r["model"], r["call"]): r["median_ms"] for r in rows
             if r["variant"] == "eager" and r.get("median_ms")}
    out = []
    for row in rows:
        base = eager.get((row["model"], row["call"]))
        speedup = base / row["median_ms"] if base and row.get("median_ms") else None
        out.append({**row, "speedup_vs_eager": None if speedup is None else round(speedup, 3)})
    return out


def cell(value: float | None, spec: str) -> str:
    """A table cell: "–" where nothing was measured, else ``value`` in the format ``spec``."""
    return "–" if value is None else format(value, spec)


def _fmt(value: Any, digits: int = 2, scientific: bool = False) -> str:
    """A table cell: "–" for missing, fixed decimals, scientific for small errors when asked."""
    if value is None:
        return "–"
    if isinstance(value, float):
        if scientific and value != 0 and abs(value) < 10 ** -digits:
            return f"{value:.2e}"
        return f"{value:.{digits}f}"
    return str(value)


def _clock(row: Mapping[str, Any]) -> str:
    """The SM clock and board power over a row's timed calls (benchmarks.dit.device_state), or "–"."""
    if row.get("sm_clock_mhz") is None:
        return "–"
    return f"{row['sm_clock_mhz']:.0f}, {row['power_w']:.0f}" if row.get("power_w") is not None else \
        f"{row['sm_clock_mhz']:.0f}"


def rows_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The main markdown table: one line per (model, variant, call)."""
    lines = ["| model | variant | call | median ms | vs eager | compile s | warm compile s | peak GB "
             "| peak GB first calls | rel err | cosine | rel err vs eager | cosine vs eager | launches "
             "| SM MHz, W | notes |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in with_speedups(rows):
        speedup = f"{r['speedup_vs_eager']:.2f}×" if r.get("speedup_vs_eager") else "–"
        notes = r.get("status", "ok") if r.get("status", "ok") != "ok" else "; ".join(r.get("notes", []))
        lines.append(f"| {r['model']} | {r['variant']} | {r['call']} | {_fmt(r.get('median_ms'))} | {speedup} "
                     f"| {_fmt(r.get('compile_s'), 1)} | {_fmt(r.get('warm_compile_s'), 1)} "
                     f"| {_fmt(peak_gb(r), 1)} | {_fmt(r.get('first_call_peak_gb'), 1)} "
                     f"| {_fmt(r.get('rel_err'), 4, scientific=True)} | {_fmt(r.get('cosine'), 6)} "
                     f"| {_fmt(r.get('rel_err_vs_eager'), 4, scientific=True)} | {_fmt(r.get('cosine_vs_eager'), 6)} "
                     f"| {_fmt(r.get('launches'), 0)} | {_clock(r)} | {notes} |")
    return "\n".join(lines)


def short_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The few columns worth a glance at the end of a log."""
    lines = ["| model | variant | call | median ms | vs eager | compile s | rel err | cosine | rel err vs eager "
             "| status |", "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in with_speedups(rows):
        speedup = f"{r['speedup_vs_eager']:.2f}×" if r.get("speedup_vs_eager") else "–"
        lines.append(f"| {r['model']} | {r['variant']} | {r['call']} | {_fmt(r.get('median_ms'))} | {speedup} "
                     f"| {_fmt(r.get('compile_s'), 1)} | {_fmt(r.get('rel_err'), 4, scientific=True)} "
                     f"| {_fmt(r.get('cosine'), 6)} | {_fmt(r.get('rel_err_vs_eager'), 4, scientific=True)} "
                     f"| {r.get('status', 'ok')} |")
    return "\n".join(lines)


def breakdown_table(breakdowns: Sequence[Mapping[str, Any]]) -> str:
    """Kernel ms per forward by category, per (model, variant); on CUDA also the profiled timeline's
    host time before the first kernel and GPU idle time between kernels (see breakdown.timeline)."""
    lines = ["| model | variant | GEMM | attention | norm/elementwise | copies | other | kernel total "
             "| median − kernels | host before 1st kernel | GPU idle between kernels | launches |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for b in breakdowns:
        ms, line = b["ms"], b.get("timeline") or {}
        variant = b["variant"] if b.get("call", "forward") == "forward" else f"{b['variant']} ({b['call']})"
        lines.append(f"| {b['model']} | {variant} | {_fmt(ms['gemm'])} | {_fmt(ms['attention'])} "
                     f"| {_fmt(ms['norm_elementwise'])} | {_fmt(ms['copies'])} | {_fmt(ms['other'])} "
                     f"| {_fmt(b['kernel_ms'])} | {_fmt(b.get('gap_ms'))} "
                     f"| {_fmt(line.get('host_before_first_kernel'))} | {_fmt(line.get('idle_between_kernels'))} "
                     f"| {_fmt(b.get('launches'), 0)} |")
    return "\n".join(lines)


def _flop(count: int) -> str:
    """12.3 TFLOP / 14.5 MFLOP: tiny and full models differ by six orders of magnitude."""
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if count >= scale:
            return f"{count / scale:.3f} {unit}"
    return f"{count} FLOP"


def _reference_dtype(results: Mapping[str, Any]) -> str:
    dtypes = sorted({info["reference"]["dtype"] for info in results.get("per_model", {}).values()
                     if info.get("reference")})
    return "/".join(dtypes) or "float32 on a GPU, float64 on the CPU"


def render_markdown(results: Mapping[str, Any]) -> str:
    """The whole report as markdown: header, rows, breakdown, ceilings and floors."""
    meta = results["meta"]
    parts = [
        f"# DiT benchmark ({results['size']}): {', '.join(results['models'])}",
        f"{meta['device']} · torch {meta['torch']} · triton {meta['triton']} · diffusers {meta['diffusers']} "
        f"· {meta['date']} · commit {(meta['git_commit'] or 'unknown')[:12]}"
        f"{' (dirty)' if meta.get('git_dirty') else ''}",
        f"{FULL_INPUTS if results['size'] == 'full' else 'tiny configs (timings mean nothing)'}"
        f", {results['dtype']}, one transformer forward; median of {results['repeats']} after "
        f"{results['warmup']} warm-up. rel err / cosine: against a higher-precision reference of the same "
        f"weights ({_reference_dtype(results)}; every op in that precision, weights upcast op by op), in float64; "
        f"eager's row is eager's own error against it. 'vs eager': against eager's output.",
        "## Rows", rows_table(results["rows"]),
        "## kopt against the best baseline of its precision", summary_table(results),
    ]
    if results.get("breakdown"):
        parts += ["## Kernel time per forward (profiler, ms)", breakdown_table(results["breakdown"])]
    if results.get("ceilings"):
        c = results["ceilings"]
        parts += ["## Ceilings (this run)",
                  f"copy {c['copy_tbs']} TB/s · bf16 matmul {c['bf16_matmul_tflops']} TFLOP/s · "
                  f"FP8 rowwise {c['fp8_rowwise_scaled_mm_tflops']} TFLOP/s · "
                  f"FP8 tensorwise {c['fp8_tensorwise_scaled_mm_tflops']} TFLOP/s"]
    for model, info in results.get("per_model", {}).items():
        reference, eager = info.get("reference"), info.get("eager_vs_reference")
        if reference and eager:
            parts.append(f"**{model}** reference: {reference['dtype']}, one forward {reference['forward_s']} s "
                         f"(upcast weight copies at most {reference['peak_upcast_gb']:.3f} GB at once); eager "
                         f"against it: rel err {_fmt(eager['rel_err'], 4, scientific=True)}, cosine "
                         f"{_fmt(eager['cosine'], 6)}")
        flops, floor = info.get("flops"), info.get("floor")
        if flops:
            parts.append(f"**{model}**: {_flop(flops['total'])} per forward (GEMM {_flop(flops['gemm'])}, "
                         f"attention {_flop(flops['attention'])}; {flops['method']})")
        if floor:
            parts.append(f"floor: bf16 {floor['floor_bf16_ms']} ms, FP8 {floor['floor_fp8_ms']} ms ({floor['note']})")
    return "\n\n".join(parts) + "\n"


def write_png(results: Mapping[str, Any], path: Path) -> str | None:
    """Horizontal bars of median ms per row, one panel per model; None, or why it was skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: skipped the PNG"
    measured = [r for r in results["rows"] if r.get("median_ms")]
    models = list(dict.fromkeys(r["model"] for r in measured))
    if not models:
        return "no measured rows: skipped the PNG"
    height = 0.8 * len(models) + 0.4 * len(measured) + 0.6
    fig, axes = plt.subplots(len(models), 1, figsize=(9, height), squeeze=False)
    for ax, model in zip(axes[:, 0], models, strict=True):
        rows = [r for r in measured if r["model"] == model]
        labels = [f"{r['variant']} ({r['call']})" for r in rows]
        values = [r["median_ms"] for r in rows]
        colors = ["tab:gray" if r["variant"] == "eager" else "tab:blue" if r["call"] == "forward"
                  else "tab:orange" for r in rows]
        ax.barh(labels, values, color=colors)
        ax.invert_yaxis()
        for y, value in enumerate(values):
            ax.text(value, y, f" {value:.1f}", va="center", fontsize=8)
        ax.set_title(f"{model} ({results['size']}, {results['meta']['device']})", fontsize=10)
        ax.set_xlabel("median ms (lower is better); gray: eager, blue: forward, orange: CFG pair")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def write_all(results: Mapping[str, Any], out_dir: Path, name: str, png: bool = True) -> list[str]:
    """Write ``name``.json and .md (and .png when ``png``); returns notes (e.g. PNG skipped)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    clean = _clean({**results, "rows": with_speedups(results["rows"]), "summary": summary_rows(results)})
    (out_dir / f"{name}.json").write_text(json.dumps(clean, indent=2) + "\n")
    (out_dir / f"{name}.md").write_text(render_markdown(clean))
    notes: list[str] = []
    if png:
        skipped = write_png(clean, out_dir / f"{name}.png")
        if skipped:
            notes.append(skipped)
    return notes
