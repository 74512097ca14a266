"""kopt against the best baseline a user could pick, per model, call and precision.

kopt's rows replay CUDA graphs, so a fair baseline replays too: ``torch.compile+graphs`` (regional
compile, whole forward captured as one CUDA graph) and its FP8 counterpart. A baseline row that
could not be captured (its ``replay`` field says why) is credited with its summed GPU kernel time
from the profiler breakdown — the best its replay could possibly do, since replay removes launch
gaps and nothing else — and marked so. Baselines that do not replay by design (plain regional
``torch.compile``) compete with their timed median. The best of all candidates of a precision is
the one kopt is compared with: bf16 kopt against bf16 baselines, FP8 kopt against FP8 baselines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

BASELINES: dict[str, tuple[str, ...]] = {
    "bf16": ("torch.compile", "torch.compile+graphs", "torch.compile-max-autotune+graphs", "torch.compile-full",
             "torch.compile-full+graphs"),
    "fp8": ("fp8+torch.compile", "fp8+torch.compile-fast-accum", "fp8+torch.compile-fast-accum+graphs"),
}


def precision(variant: str) -> str:
    """``fp8`` for FP8 variants (kopt's and the baselines'), else ``bf16``."""
    return "fp8" if "fp8" in variant else "bf16"


def _kernel_ms(breakdowns: Sequence[Mapping[str, Any]], model: str, variant: str, call: str) -> float | None:
    """Summed GPU kernel ms of that row's profile (None on the CPU, where ops are not kernels)."""
    for entry in breakdowns:
        if (entry["model"], entry["variant"], entry.get("call", "forward")) == (model, variant, call):
            return entry.get("kernel_ms") if entry.get("activity", "cuda kernels") == "cuda kernels" else None
    return None


def baseline_ms(row: Mapping[str, Any], breakdowns: Sequence[Mapping[str, Any]]) -> tuple[float | None, str]:
    """The time a baseline row competes with, and how it was obtained."""
    replay = row.get("replay")
    if replay is None or replay == "replayed" or not row["variant"].endswith("+graphs"):
        return row.get("median_ms"), "timed"
    if replay == "not replayed: CPU":
        return row.get("median_ms"), "timed (CPU: nothing to replay)"
    bound = _kernel_ms(breakdowns, row["model"], row["variant"], row["call"])
    if bound is None:
        return None, f"{replay}; no kernel time to bound it"
    return bound, f"replay bound: summed kernel time ({replay})"


def best_baselines(results: Mapping[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(model, call, precision) -> the fastest baseline: variant, ms, and how the ms was obtained."""
    best: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in results["rows"]:
        kind = next((k for k, names in BASELINES.items() if row["variant"] in names), None)
        if kind is None or row.get("status", "ok") != "ok":
            continue
        ms, how = baseline_ms(row, results.get("breakdown") or [])
        key = (row["model"], row["call"], kind)
        if ms is not None and (key not in best or ms < best[key]["ms"]):
            best[key] = {"variant": row["variant"], "ms": ms, "how": how}
    return best


def summary_rows(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per kopt row: its time against the best baseline of its precision (gain in percent)."""
    best = best_baselines(results)
    out = []
    for row in results["rows"]:
        if not row["variant"].startswith("kopt") or not row.get("median_ms"):
            continue
        base = best.get((row["model"], row["call"], precision(row["variant"])))
        gain = None if base is None else 100.0 * (base["ms"] - row["median_ms"]) / base["ms"]
        out.append({"model": row["model"], "variant": row["variant"], "call": row["call"],
                    "kopt_ms": row["median_ms"], "baseline": base and base["variant"],
                    "baseline_ms": base and base["ms"], "baseline_how": base and base["how"],
                    "gain_pct": None if gain is None else round(gain, 2),
                    **_compile_and_memory(results["rows"], row, base and base["variant"])})
    return out


def peak_gb(row: Mapping[str, Any]) -> float | None:
    """A row's steady-state peak memory (rows written before the rename call it ``peak_mem_gb``)."""
    return row.get("peak_gb", row.get("peak_mem_gb"))


def forward_row(rows: Sequence[Mapping[str, Any]], model: str, variant: str | None) -> Mapping[str, Any]:
    """That variant's forward row (the one whose first call compiled), or an empty mapping."""
    return next((r for r in rows if (r["model"], r["variant"], r["call"]) == (model, variant, "forward")), {})


def _compile_and_memory(rows: Sequence[Mapping[str, Any]], row: Mapping[str, Any],
                        baseline: str | None) -> dict[str, Any]:
    """Cold and warm compile seconds of kopt and of the baseline, and peak memory against eager's."""
    mine, theirs = forward_row(rows, row["model"], row["variant"]), forward_row(rows, row["model"], baseline)
    eager = forward_row(rows, row["model"], "eager")
    peak, eager_peak = peak_gb(row), peak_gb(eager)
    return {"kopt_compile_s": mine.get("compile_s"), "kopt_warm_compile_s": mine.get("warm_compile_s"),
            "baseline_compile_s": theirs.get("compile_s"), "baseline_warm_compile_s": theirs.get("warm_compile_s"),
            "peak_gb": peak, "peak_vs_eager": peak / eager_peak if peak and eager_peak else None}


def summary_table(results: Mapping[str, Any]) -> str:
    """Markdown: kopt against the best baseline of its precision."""
    lines = ["| model | kopt variant | call | kopt ms | best baseline | baseline ms | kopt faster by "
             "| compile s kopt (warm) | compile s baseline (warm) | peak vs eager | how |",
             "|---|---|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in summary_rows(results):
        gain = "–" if r["gain_pct"] is None else f"{r['gain_pct']:+.1f} %"
        base_ms = "–" if r["baseline_ms"] is None else f"{r['baseline_ms']:.2f}"
        first = r["call"] == "forward"  # compile time and peak memory: once per variant
        peak = f"{r['peak_vs_eager']:.2f}×" if first and r["peak_vs_eager"] else "–"
        lines.append(f"| {r['model']} | {r['variant']} | {r['call']} | {r['kopt_ms']:.2f} | {r['baseline'] or '–'} "
                     f"| {base_ms} | {gain} "
                     f"| {_seconds(r['kopt_compile_s'], r['kopt_warm_compile_s']) if first else '–'} "
                     f"| {_seconds(r['baseline_compile_s'], r['baseline_warm_compile_s']) if first else '–'} "
                     f"| {peak} | {r['baseline_how'] or 'no baseline of this precision ran'} |")
    return "\n".join(lines)


def _seconds(cold: float | None, warm: float | None) -> str:
    """``cold (warm)`` in seconds, ``–`` where not measured."""
    if cold is None:
        return "–"
    return f"{cold:.1f} ({warm:.1f})" if warm is not None else f"{cold:.1f} (–)"
