"""What a run shows at the end: a table of every candidate, and a plot of time per region against its floor."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def candidate_table(result: Any) -> str:
    """One line per evaluated candidate: region, kind, parameters, status, E2E speedup with CI, reason."""
    lines = [f"{'region':<12} {'kind':<16} {'params':<28} {'status':<9} {'s':>6} {'speedup [95% CI]':<26} reason",
             "-" * 127]
    for evaluation in result.evaluations:
        candidate = evaluation.candidate
        params = ",".join(f"{k}={v}" for k, v in candidate.params if k != "generator") or candidate.origin
        e2e = evaluation.e2e.speedup if evaluation.e2e else None
        numbers = f"{e2e.median:.4f}x [{e2e.ci_low:.4f}, {e2e.ci_high:.4f}]" if e2e else "-"
        lines.append(f"{candidate.region_signature[:12]:<12} {candidate.kind.value:<16} {params[:28]:<28} "
                     f"{evaluation.status.value:<9} {evaluation.seconds:>6.1f} {numbers:<26} {evaluation.reason[:90]}")
    accepted = sum(1 for e in result.evaluations if e.status.value == "accepted")
    timed = [e for e in result.evaluations if e.e2e is not None]
    lines.append(f"{len(result.evaluations)} evaluated ({accepted} accepted; {len(timed)} timed end to end in "
                 f"{sum(e.seconds for e in timed):.0f} s, {len(result.evaluations) - len(timed)} settled before "
                 f"in {sum(e.seconds for e in result.evaluations if e.e2e is None):.0f} s), {result.skipped} skipped "
                 f"(already in the knowledge base), {len(result.resumed)} accepted earlier; clock: "
                 f"{result.clock.name}; {result.elapsed_s:.0f} s" + (f"; stopped: {result.stopped}" if result.stopped
                                                                      else ""))
    if getattr(result, "deferred", None):
        lines.append(f"{len(result.deferred)} not started, longer than the time left (GEMM tuning, or a kind "
                     "whose evaluations took longer): "
                     + "; ".join(dict(c.params).get("change", c.kind.value) for c in result.deferred)[:300])
    unreplayed = getattr(result.clock, "unreplayed", None)
    if unreplayed:
        lines.append(f"{len(unreplayed)} side(s) of the A/B ran as plain calls, not replayed from a CUDA graph: "
                     + "; ".join(sorted(set(unreplayed.values())))[:300])
    if result.verified_ahead:
        from kopt.agent.pool import most_in_flight

        lines.append(f"verification: {result.pool}; {len(result.verified_ahead)} verified ahead of the timing, "
                     f"at most {most_in_flight(result.verified_ahead)} at once")
    return "\n".join(lines)


def region_rows(result: Any) -> list[tuple[str, float, float, float]]:
    """(region, seconds before, seconds after, floor) per region signature, per model call, in the
    clock's terms: the cost model's for a cost-model run, else profiled on this device. After is NaN
    for a region an accepted pipeline choice rewrote away (its work now runs in other kernels, so
    neither its old time nor zero would be true)."""
    from kopt.agent.cost_model import CostModelClock

    if isinstance(result.clock, CostModelClock):
        model = result.clock.model
        from kopt.agent.floor import region_floor

        rows: dict[str, list[float]] = {}
        for occurrence in result.occurrences:
            signature = occurrence.region.signature
            row = rows.setdefault(signature, [0.0, 0.0, 0.0])
            before = model.occurrence_s(occurrence)
            candidate = result.accepted.get(signature)
            row[0] += before
            row[1] += model.candidate_s(occurrence, candidate) if candidate else before
            row[2] += region_floor(occurrence.region, model.ceilings).seconds
        return [(s[:12], *v) for s, v in rows.items()]
    from kopt.agent.bench import applied
    from kopt.agent.profile import profile_applied

    after = profile_applied(result.graphs, applied(result.graphs, result.accepted), result.occurrences)
    return [(r.region.signature[:12], r.seconds, after.get(r.region.signature, math.nan),
             r.floor.seconds * r.occurrences) for r in result.profile.regions]


def lowered_per_call(result: Any) -> dict[str, float]:
    """Per region (signature's first 12 characters, as in :func:`region_rows`), seconds per model call
    as Inductor lowers the region alone, where the run's micro step measured it (a GPU run): the
    profile's "before" is the region op by op, which overstates what a fusible region costs in the
    compiled model."""
    lowered = getattr(result, "lowered_s", None) or {}
    return {r.region.signature[:12]: lowered[r.region.signature] * r.occurrences
            for r in result.profile.regions if r.region.signature in lowered}


def region_plot(result: Any, path: Path, top: int = 16) -> Path:
    """A PNG bar chart: per region, time before and after the accepted candidates, and the floor; where
    measured, also the region as Inductor lowers it (:func:`lowered_per_call`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(region_rows(result), key=lambda r: -r[1])[:top]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(rows) + 2), 4.5))
    xs = range(len(rows))
    width = 0.38
    ax.bar([x - width / 2 for x in xs], [r[1] * 1e6 for r in rows], width, label="before")
    ax.bar([x + width / 2 for x in xs], [0.0 if math.isnan(r[2]) else r[2] * 1e6 for r in rows], width,
           label="after")
    for x, row in zip(xs, rows, strict=True):
        if math.isnan(row[2]):
            ax.text(x + width / 2, 0, "rewritten by\na pipeline choice", rotation=90, ha="center", va="bottom",
                    fontsize=7)
    ax.scatter(list(xs), [r[3] * 1e6 for r in rows], marker="_", s=400, color="black", zorder=3, label="floor")
    lowered = lowered_per_call(result)
    marks = [(x, lowered[row[0]]) for x, row in zip(xs, rows, strict=True) if row[0] in lowered]
    if marks:
        ax.scatter([x - width / 2 for x, _ in marks], [seconds * 1e6 for _, seconds in marks], marker="v", s=60,
                   color="tab:red", zorder=4, label="before, as Inductor lowers it")
    ax.set_xticks(list(xs), [r[0] for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("µs per model call")
    ax.set_title(f"time per region ({result.clock.name}) vs floor")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
