#!/usr/bin/env python3
"""Where a kopt row's time differs from its best baseline's: per kernel category, and per library kernel.

    python benchmarks/dit/gap.py benchmarks/results/dit-full-ltx-video-s16a.json [...] [--against VARIANT] [--out STEM]

For every profiled kopt forward of the file, against the fastest baseline of its precision (the
summary table's, :func:`benchmarks.dit.summary.best_baselines`) or against ``--against``: the kernel
time per category (GEMM, attention, norm/elementwise, copies, other) and the host gap, kopt minus
baseline; the library kernels (GEMM, attention) that both forwards ran under the same name, with
their time in each; and what kopt's median would be if its GEMM and attention kernels took the
baseline's time. Why it is the right question for issue 9's goals: kopt rewrites the graph around
the GEMMs and attention, which both sides hand to the same libraries, so a gap that sits in those
kernels is not a rewrite's but a matter of how the forward runs them (clocks, launch overlap,
operand layouts); a gap elsewhere is the rewrites'.

A kernel launched with programmatic dependent launch starts before the kernel ahead of it has
finished and waits on the device, and its profiled duration includes that wait: where the kernels'
summed time exceeds the forward's median (a negative host gap), the per-category times overlap and
the report says so. ``dit.py``'s ``-nopdl`` variants give an attribution without overlap.

Two more lines per section say what the gap to issue 9's speed goal is made of:

* the GEMM rate of each forward (the file's counted GEMM FLOPs over its GEMM kernel time), and
  eager's where it was profiled (bf16 rows only): the same cuBLAS kernels at the same shapes run slower in a dense
  replayed forward than in eager's sparser stream (the card's clock under its power cap), so a
  GEMM-time difference between two replayed forwards at similar rates is the same kernels, not a
  layout;
* the SM clock and power over each row's timed calls, where the run recorded them
  (:mod:`benchmarks.dit.device_state`);
* the milliseconds kopt still has to cut to reach the goal, against its kernel time outside GEMM and
  attention (what rewrites and fusions act on) and the largest kernels there.

``--out STEM`` also writes ``STEM.md``; several files make one report.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    import sys

    sys.path.append(str(Path(__file__).resolve().parents[2]))

from benchmarks.dit.goals import SPEED_GOAL_PCT  # noqa: E402
from benchmarks.dit.summary import best_baselines, forward_row, precision  # noqa: E402

CATEGORIES = ("gemm", "attention", "norm_elementwise", "copies", "other")
LIBRARY = ("gemm", "attention")


def _breakdown(results: Mapping[str, Any], model: str, variant: str) -> Mapping[str, Any] | None:
    return next((b for b in results.get("breakdown") or []
                 if (b["model"], b["variant"], b["call"]) == (model, variant, "forward")), None)


def _median(results: Mapping[str, Any], model: str, variant: str) -> float | None:
    return forward_row(results["rows"], model, variant).get("median_ms")


def compare(results: Mapping[str, Any], model: str, kopt: str, baseline: str) -> dict[str, Any] | None:
    """The two forwards' category times, their library kernels by name, and the median kopt would have
    with the baseline's library-kernel times; None where either forward was not profiled."""
    mine, theirs = _breakdown(results, model, kopt), _breakdown(results, model, baseline)
    kopt_ms, base_ms = _median(results, model, kopt), _median(results, model, baseline)
    if mine is None or theirs is None or kopt_ms is None or base_ms is None:
        return None
    categories = {c: (theirs["ms"].get(c, 0.0), mine["ms"].get(c, 0.0)) for c in CATEGORIES}
    categories["host gap"] = (theirs.get("gap_ms", 0.0), mine.get("gap_ms", 0.0))
    theirs_by_name = {k["name"]: k for k in theirs["top"] if k["category"] in LIBRARY}
    shared = [{"name": k["name"], "category": k["category"], "kopt_calls": k["calls_per_forward"],
               "baseline_calls": theirs_by_name[k["name"]]["calls_per_forward"],
               "baseline_ms": theirs_by_name[k["name"]]["ms"], "kopt_ms": k["ms"]}
              for k in mine["top"] if k["name"] in theirs_by_name]
    library_excess = sum(mine["ms"].get(c, 0.0) - theirs["ms"].get(c, 0.0) for c in LIBRARY)
    with_their_library = kopt_ms - library_excess
    overlap = max(0.0, mine["kernel_ms"] - kopt_ms) if "kernel_ms" in mine else 0.0
    goal = SPEED_GOAL_PCT[precision(kopt)]
    eager = _breakdown(results, model, "eager") if precision(kopt) == "bf16" else None  # eager is bf16
    outside = {k["name"]: k["ms"] for k in mine["top"] if k["category"] not in LIBRARY}
    return {"model": model, "kopt": kopt, "baseline": baseline, "kopt_ms": kopt_ms, "baseline_ms": base_ms,
            "goal_pct": goal, "to_cut_ms": kopt_ms - (1 - goal / 100) * base_ms,
            "outside_library_ms": sum(mine["ms"].get(c, 0.0) for c in CATEGORIES if c not in LIBRARY),
            "largest_outside": sorted(outside.items(), key=lambda item: -item[1])[:4],
            "gemm_tflops": {name: _gemm_rate(results, model, b) for name, b in
                            (("baseline", theirs), ("kopt", mine), ("eager", eager))},
            "clocks": {name: (row.get("sm_clock_mhz"), row.get("power_w")) for name, row in
                       (("baseline", forward_row(results["rows"], model, baseline)),
                        ("kopt", forward_row(results["rows"], model, kopt)))},
            "overlap_ms": overlap, "gain_pct": 100.0 * (base_ms - kopt_ms) / base_ms,
            "categories": categories, "shared": shared,
            "library_excess_ms": library_excess,
            "gain_with_their_library_pct": 100.0 * (base_ms - with_their_library) / base_ms}


def _gemm_rate(results: Mapping[str, Any], model: str, breakdown: Mapping[str, Any] | None) -> float | None:
    """TFLOP/s: the model's counted GEMM FLOPs per forward over the forward's GEMM kernel time."""
    flops = (((results.get("per_model") or {}).get(model) or {}).get("flops") or {}).get("gemm")
    gemm_ms = breakdown["ms"].get("gemm") if breakdown is not None else None
    return flops / (gemm_ms * 1e-3) / 1e12 if flops and gemm_ms else None


def pairs(results: Mapping[str, Any], against: str | None) -> list[tuple[str, str, str]]:
    """(model, kopt variant, baseline variant) for every kopt forward row of the file."""
    best = best_baselines(results)
    out = []
    for row in results["rows"]:
        if row["call"] != "forward" or not row["variant"].startswith("kopt") or row["variant"] == against:
            continue
        base = against or (best.get((row["model"], "forward", precision(row["variant"]))) or {}).get("variant")
        if base:
            out.append((row["model"], row["variant"], base))
    return out


def report(results: Mapping[str, Any], against: str | None = None) -> str:
    """Markdown: one section per kopt forward with both forwards profiled."""
    lines: list[str] = []
    for model, kopt, baseline in pairs(results, against):
        c = compare(results, model, kopt, baseline)
        if c is None:
            lines.append(f"{model}: {kopt} or {baseline} has no profiled forward in this file\n")
            continue
        lines += [f"## {model}: {kopt} {c['kopt_ms']:.2f} ms against {baseline} {c['baseline_ms']:.2f} ms "
                  f"({c['gain_pct']:+.1f} % faster)", "",
                  "| kernel time per forward | baseline ms | kopt ms | kopt − baseline |", "|---|---:|---:|---:|"]
        lines += [f"| {name} | {b:.2f} | {k:.2f} | {k - b:+.2f} |" for name, (b, k) in c["categories"].items()]
        lines += ["", _shared_table(c["shared"]), "",
                  f"With the baseline's GEMM and attention kernel times ({c['library_excess_ms']:+.2f} ms in kopt's), "
                  f"kopt would be {c['gain_with_their_library_pct']:+.1f} % faster.", ""]
        rates = ", ".join(f"{name} {rate:.0f}" for name, rate in c["gemm_tflops"].items() if rate is not None)
        if rates:
            lines += [f"GEMM rate (counted GEMM FLOPs over GEMM kernel time), TFLOP/s: {rates}.", ""]
        clocks = {name: value for name, value in c["clocks"].items() if value[0] is not None}
        if len(clocks) == 2:
            (base_mhz, base_w), (kopt_mhz, kopt_w) = clocks["baseline"], clocks["kopt"]
            lines += [f"SM clock over the timed calls: baseline {base_mhz:.0f} MHz at {base_w or 0:.0f} W, kopt "
                      f"{kopt_mhz:.0f} MHz at {kopt_w or 0:.0f} W ({100.0 * (kopt_mhz - base_mhz) / base_mhz:+.1f} %: "
                      "GEMM and attention kernels slow with the clock).", ""]
        if c["to_cut_ms"] > 0:
            largest = "; ".join(f"{name[:60]} {ms:.2f}" for name, ms in c["largest_outside"]) or "none listed"
            lines += [f"To reach the {c['goal_pct']:g} % goal kopt must cut {c['to_cut_ms']:.2f} ms more; its kernels "
                      f"outside GEMM and attention take {c['outside_library_ms']:.2f} ms (largest: {largest}).", ""]
        else:
            lines += [f"The {c['goal_pct']:g} % goal is met.", ""]
        if c["overlap_ms"] > 0:
            lines += [f"kopt's kernels add up to {c['overlap_ms']:.2f} ms more than its median: kernels overlapped "
                      "(one launched with programmatic dependent launch counts its wait for the one before), or the "
                      "profiled forward ran slower than the median.", ""]
    return "\n".join(lines)


def _shared_table(shared: Sequence[Mapping[str, Any]]) -> str:
    if not shared:
        return "No GEMM or attention kernel ran under the same name in both forwards' largest kernels."
    rows = ["| library kernel (same name in both) | calls baseline / kopt | baseline ms | kopt ms | kopt − baseline |",
            "|---|---:|---:|---:|---:|"]
    for s in shared:
        same = s["baseline_calls"] == s["kopt_calls"]
        delta = f"{s['kopt_ms'] - s['baseline_ms']:+.2f}" if same else "– (other shapes)"
        rows.append(f"| {s['name'][:70]} | {s['baseline_calls']:.0f} / {s['kopt_calls']:.0f} | {s['baseline_ms']:.2f} "
                    f"| {s['kopt_ms']:.2f} | {delta} |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="+", help="dit.py results JSONs with profiled forwards")
    parser.add_argument("--against", default=None, help="compare every kopt row with this variant instead")
    parser.add_argument("--out", type=Path, default=None, help="also write STEM.md")
    args = parser.parse_args(argv)
    sections = [f"# {path.name}\n\n{report(json.loads(path.read_text()), args.against)}" for path in args.results]
    text = "\n".join(sections)
    print(text)
    if args.out is not None:
        args.out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
