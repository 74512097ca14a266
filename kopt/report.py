"""The report a compiled module exposes as ``kopt_report``: what fired, what almost did, what it cost.

Printable as a table (``str(report)``) and serialisable (``report.to_json()``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from kopt.passes.base import NearMiss


@dataclasses.dataclass
class PassRecord:
    """One pass on one graph."""

    name: str
    why: str
    contract: str
    status: str  # applied | no match | skipped: <error> | out of fuel
    matches: dict[str, int]
    near_misses: list[NearMiss]
    before: dict[str, int]
    after: dict[str, int]
    seconds: float
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def total_matches(self) -> int:
        return sum(self.matches.values())


@dataclasses.dataclass
class GraphReport:
    """Everything kopt did to one dynamo graph."""

    index: int
    inputs: list[dict[str, Any]]
    passes: list[PassRecord] = dataclasses.field(default_factory=list)
    lowering: str = ""
    capture_seconds: float = 0.0
    compile_seconds: float = 0.0
    fallback: str | None = None  # why the original graph runs instead of the rewritten one
    verification: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    weight_refreshes: int = 0  # full rebuilds (kopt_refresh(), or a change kopt could not re-derive)
    weight_rederivations: int = 0  # times derived constants were computed again after weights changed
    # how the lowered graph gets its weights (kopt.fx.weights): live, derived, watched (and the check)
    weights: dict[str, Any] = dataclasses.field(default_factory=dict)
    memo: Any = None  # kopt.fx.staged_program.MemoStats of the step-invariant stage, live
    cuda_graphs: Any = None  # kopt.cuda_graphs.CudaGraphStats of the per-step stage, live (None: not used)
    lowering_check: Any = None  # kopt.checks.LoweringCheck (None: not checked: lower="eager" or turned off)
    reference_unavailable: str | None = None  # why checks judged against eager instead of the reference
    hazards: list[Any] = dataclasses.field(default_factory=list)  # kopt.fx.precision_hazards.PrecisionHazard


@dataclasses.dataclass
class Report:
    """The whole compilation: one :class:`GraphReport` per dynamo graph, and graph breaks."""

    graphs: list[GraphReport] = dataclasses.field(default_factory=list)
    graph_breaks: list[str] = dataclasses.field(default_factory=list)
    released_bytes: int = 0  # weights freed by release_weights=True (no compiled graph reads them)
    eager_calls: int = 0  # calls that ran no kopt graph at all (kopt.fallback)
    eager_fallback: str | None = None  # why the last of them did
    recompile_limit: str | None = None  # dynamo's recompile-limit warning for this module, if it hit one
    forward_replay: Any = None  # regional: kopt.cuda_graphs.CudaGraphStats of the whole-forward replay, live

    def pass_records(self, name: str) -> list[PassRecord]:
        return [p for g in self.graphs for p in g.passes if p.name == name]

    def matches(self, name: str) -> int:
        """Rewrites the pass named ``name`` applied, over all graphs."""
        return sum(p.total_matches for p in self.pass_records(name))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def __str__(self) -> str:
        return render(self)


def _delta(before: dict[str, int], after: dict[str, int]) -> str:
    keys = sorted(set(before) | set(after))
    parts = [f"{k} {before.get(k, 0)}→{after.get(k, 0)}" for k in keys
             if before.get(k, 0) != after.get(k, 0)]
    return ", ".join(parts) or "unchanged"


def describe_weights(weights: dict[str, Any]) -> str:
    """One line: which weights the lowered graph reads live, which are derived, how changes are seen."""
    text = f"weights: {weights['live']} read live, {weights['derived']} derived by kopt"
    if not weights["watched"]:
        return text + " (from no module weight: nothing to watch)"
    if weights["check"] == "none":
        return text + f"; {weights['watched']} they depend on are not watched (on_weight_change=ignore)"
    cost = (f", reading {weights['watched_bytes'] / 2**20:,.1f} MiB per call (weight_check='version' skips "
            "the read and misses writes through param.data)" if weights["check"] == "checksum" else "")
    shared = (f"; {weights['shared_bytes'] / 2**20:,.1f} MiB of module weights became views of the merged "
              "weights (held once; share_weights=False keeps them)" if weights.get("shared_bytes") else "")
    return text + (f"; {weights['watched']} module weights they depend on watched by {weights['check']}{cost}; "
                   f"on a change: {weights['on_change']}{shared}")


def render(report: Report, max_near_misses: int = 5) -> str:
    """A plain-text table per graph: pass, contract, status, matches, node changes, time."""
    lines = [f"kopt report: {len(report.graphs)} graph(s), {len(report.graph_breaks)} graph break(s)"]
    for reason in report.graph_breaks:
        lines.append(f"  graph break: {reason}")
    if report.eager_calls:
        lines.append(f"  EAGER FALLBACK: {report.eager_calls} call(s) ran without kopt: {report.eager_fallback}")
    elif report.recompile_limit:
        lines.append(f"  EAGER FALLBACK for calls no compiled graph matches: {report.recompile_limit}")
    if report.released_bytes:
        lines.append(f"  released {report.released_bytes / 2**20:,.1f} MiB of module weights no compiled graph reads "
                     "(release_weights; on by default with regional fp8)")
    if report.forward_replay is not None:
        lines.append(f"  whole forward: {report.forward_replay.describe()}")
    for graph in report.graphs:
        lines.append(f"\ngraph {graph.index}: lowered with {graph.lowering or '?'}; capture "
                     f"{graph.capture_seconds:.2f}s, compile {graph.compile_seconds:.2f}s")
        roles: dict[str, list[str]] = {}
        for entry in graph.inputs:
            if entry["role"] != "constant":
                reason = entry["reason"].split("': ", 1)[-1]  # the rule, without the repeated name
                roles.setdefault(entry["role"], []).append(f"{entry['argument']} [{reason}]")
        constants = sum(1 for entry in graph.inputs if entry["role"] == "constant")
        lines.append(f"  inputs: {constants} constant (parameters/buffers)")
        for role, names in roles.items():
            lines.append(f"  inputs {role}: " + ", ".join(names))
        unclassified = [entry["argument"] for entry in graph.inputs if entry["reason"].startswith("UNCLASSIFIED")]
        if unclassified:
            lines.append("  UNCLASSIFIED inputs (kept per-call, nothing they feed hoisted): " + ", ".join(unclassified))
        if graph.fallback:
            lines.append(f"  FALLBACK to the original graph: {graph.fallback}")
        if graph.hazards:
            lines.append(f"  precision hazards ({len(graph.hazards)}):")
            lines += [f"      {hazard.describe()}" for hazard in graph.hazards]
        header = f"  {'pass':<22} {'contract':<24} {'status':<14} {'matches':>7} {'time':>7}  nodes"
        lines.append(header)
        for record in graph.passes:
            lines.append(f"  {record.name:<22} {record.contract:<24} {record.status[:14]:<14} "
                         f"{record.total_matches:>7} {record.seconds:>6.2f}s  "
                         f"{_delta(record.before, record.after)}")
            if record.status.startswith("skipped"):
                lines.append(f"      {record.status}")
            for rule, count in sorted(record.matches.items()):
                lines.append(f"      fired {rule} ×{count}")
            for miss in record.near_misses[:max_near_misses]:
                lines.append(f"      near miss {miss.rule} at {miss.node}: {miss.reason}")
            if len(record.near_misses) > max_near_misses:
                lines.append(f"      … {len(record.near_misses) - max_near_misses} more near misses")
            for note in record.notes:
                lines.append(f"      note: {note}")
        for check in graph.verification:
            lines.append(f"  verify output {check['output']}: {check['verdict']}")
        if graph.reference_unavailable:
            lines.append(f"  no higher-precision reference ({graph.reference_unavailable}): judged against eager")
        if graph.lowering_check is not None:
            lines.append(f"  {graph.lowering_check.describe()}")
            for check in graph.lowering_check.outputs:
                lines.append(f"      output {check['output']}: {check['verdict']}")
        if graph.memo is not None:
            bypassed = (f", {graph.memo.bypassed} calls computed without reading the keys (missed in a row)"
                        if graph.memo.bypassed else "")
            lines.append(f"  step-invariant memo: {graph.memo.hits} hits, {graph.memo.misses} misses, "
                         f"{graph.memo.evictions} evictions{bypassed}")
        if graph.cuda_graphs is not None:
            lines.append(f"  {graph.cuda_graphs.describe()}")
        if graph.weights:
            lines.append("  " + describe_weights(graph.weights))
        if graph.weight_rederivations:
            lines.append(f"  derived constants computed again {graph.weight_rederivations}× after weights changed")
        if graph.weight_refreshes:
            lines.append(f"  recompiled {graph.weight_refreshes}× after weights changed")
    return "\n".join(lines)
