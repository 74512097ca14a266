"""``passes="auto"`` with the knowledge base's pipeline choices: another pass list for matching graphs.

A compile has one pass list for all its graphs; a pipeline choice (:mod:`kopt.agent.pipeline_choice`)
holds for one graph signature. So the list becomes: :class:`PipelineSelect` first, then the union of
the base list and every applicable choice's passes, each wrapped in a :class:`ChosenPass` that runs
its pass only on the graphs whose pipeline includes it. ``PipelineSelect`` computes the graph's
signature before any pass; where the KB accepted a choice for it (in this environment, measured
against exactly this base list), the choice is verified again on first use in the process: the
rewritten graph's outputs on fresh inputs against the higher-precision reference of the graph, within
the choice's contract. A choice that fails is not used (the graph gets the base list), the report's
near misses say why, and the KB gets a ``rejected`` record superseding the accepted one. A choice
that patches Inductor's config for its graph puts the patches in the graph's meta
(:data:`kopt.lower.INDUCTOR_PATCHES_KEY`), where the backend's lowering takes them; kopt's lowering
check (on by default with Inductor) then checks that lowering against the higher-precision reference.

A choice measured against an older base list (one a newer kopt has since added passes to, as
``split-concat-linear`` joined ``"auto"``) still applies to a graph those added passes leave unchanged:
there the old base and the new one run the same rewrites, so the measurement describes what would run.
:class:`PipelineSelect` runs the new base up to its last added pass on a copy of the graph and declines
the choice, saying why, where an added pass changes it.

Why the union is faithful: a choice is an ordered list of names, and each name sits in the union
after the names that precede it in that list (inserted before the next name both share), so every
graph sees its own passes in its own order; a pass name never runs twice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from kopt.lower import INDUCTOR_PATCHES_KEY
from kopt.passes.base import Contract, Pass, PassContext

RULE = "kb-pipeline"
CHOICE_KEY = "kopt_agent_choice"  # graph_module.meta: the signature whose choice this graph runs
_VERIFIED: dict[str, str | None] = {}  # content hash -> None (passed) or why it failed, per process
_LOCK = threading.Lock()


def added_to_base(measured: Sequence[str], base: Sequence[str]) -> list[str] | None:
    """The passes ``base`` has beyond ``measured`` (the base list a choice was measured against), when
    that is all that differs: ``base`` without them is ``measured``, in order. None otherwise."""
    if [name for name in base if name in measured] != list(measured):
        return None
    return [name for name in base if name not in measured]


def accepted_choices(path: Path, base: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    """Graph signature -> (candidate, record) of the best accepted pipeline choice measured against
    ``base`` in this environment (:func:`kopt.agent.pipeline_choice.best_accepted`: choices kept on
    top of one another count their chain's speedups together); for a graph with none, the best one
    measured against an older base that ``base`` only adds passes to (:func:`added_to_base`; whether
    those change the graph is :class:`PipelineSelect`'s check)."""
    from kopt.agent.candidate import Candidate, CandidateKind
    from kopt.agent.kb import KnowledgeBase, Status, current_environment
    from kopt.agent.pipeline_choice import best_accepted, from_candidate

    exact: dict[str, list[Any]] = {}
    older: dict[str, list[Any]] = {}
    with KnowledgeBase(path) as kb:
        for record in kb.latest(environment=current_environment()):
            if record.status is not Status.ACCEPTED or record.candidate["kind"] != CandidateKind.PASS_CHOICE.value:
                continue
            candidate = Candidate.from_dict(record.candidate)
            measured = from_candidate(candidate).base
            if measured == tuple(base):
                exact.setdefault(candidate.region_signature, []).append(record)
            elif added_to_base(measured, base):
                older.setdefault(candidate.region_signature, []).append(record)
    per_graph = {**older, **exact}  # a choice measured against this very base wins
    best = {signature: best_accepted(records) for signature, records in per_graph.items()}
    return {signature: (Candidate.from_dict(record.candidate), record) for signature, record in best.items()}


class ChosenPass(Pass):
    """One pass name of the union: runs the instance of the graph's pipeline, or nothing."""

    def __init__(self, name: str, instances: Mapping[str | None, Pass]) -> None:
        self.name, self.instances = name, dict(instances)
        first = next(iter(self.instances.values()))
        self.why, self.contract = first.why, first.contract

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        rewrite = self.instances.get(graph_module.meta.get(CHOICE_KEY))
        if rewrite is not None:
            rewrite.apply(graph_module, ctx)

    def may_run(self) -> list[Pass]:
        return list(self.instances.values())

    def mapped(self, change: Callable[[Pass], Pass]) -> Pass:
        return ChosenPass(self.name, {key: rewrite.mapped(change) for key, rewrite in self.instances.items()})


def _reverify(path: Path, graph_module: torch.fx.GraphModule, candidate: Any, record: Any) -> str | None:
    from kopt.agent.kb import KnowledgeBase, Status
    from kopt.agent.pipeline_choice import from_candidate, output_checks, random_args, run_choice, structural_copy

    with _LOCK:
        if candidate.content_hash in _VERIFIED:
            return _VERIFIED[candidate.content_hash]
    choice = from_candidate(candidate)
    try:
        original = structural_copy(graph_module)
        checks = output_checks(original, run_choice(original, choice), random_args(original, seed=0), choice.contract)
        bad = [c for c in checks if not c["ok"]]
        reason = f"output {bad[0]['output']}: {bad[0]['verdict']}" if bad else None
    except Exception as error:  # noqa: BLE001 - a choice that cannot be checked is not used
        reason = f"could not be checked: {type(error).__name__}: {error}"
    if reason is not None:
        with KnowledgeBase(path) as kb:
            kb.record_candidate(candidate, status=Status.REJECTED, reason=f"re-verification on first use: {reason}",
                                verdict={"kind": "whole-model", "accepted": False, "reason": reason},
                                supersedes=record)
    with _LOCK:
        _VERIFIED[candidate.content_hash] = reason
    return reason


class PipelineSelect(Pass):
    """Pick the graph's pipeline: the KB's verified choice for its signature, else the base list."""

    name = RULE
    why = "chooses which passes run; each chosen pass keeps its own contract (ChosenPass)"
    contract = Contract.exact()

    def __init__(self, path: Path | None, choices: Mapping[str, tuple[Any, Any]], base: Sequence[Pass] = ()) -> None:
        # path None: the choices come from the caller, who checks the outputs (the agent's own A/B)
        self.path, self.choices = (Path(path) if path is not None else None), dict(choices)
        self.base = list(base)  # the current base list: what a choice measured against an older one is checked on

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        from kopt.agent.pipeline_choice import from_candidate, graph_signature

        graph_module.meta[CHOICE_KEY] = None
        signature = graph_signature(graph_module)
        if signature not in self.choices:
            return
        candidate, record = self.choices[signature]
        added = added_to_base(from_candidate(candidate).base, [p.name for p in self.base]) if self.base else None
        changed = _changed_by(graph_module, self.base, added) if added else []
        if changed:
            ctx.decline(RULE, f"graph {signature[:12]}",
                        f"KB pipeline choice {candidate.content_hash[:12]} was measured before {', '.join(changed)} "
                        "joined the base list, which change this graph: the measurement does not describe it")
            return
        reason = _reverify(self.path, graph_module, candidate, record) if self.path is not None else None
        if reason is not None:
            ctx.decline(RULE, f"graph {signature[:12]}", f"KB pipeline choice {candidate.content_hash[:12]} failed "
                                                         f"re-verification: {reason}")
            return
        graph_module.meta[CHOICE_KEY] = signature
        choice = from_candidate(candidate)
        if choice.inductor:  # lowered with its patches (checked by kopt's lowering check on first use)
            graph_module.meta[INDUCTOR_PATCHES_KEY] = choice.inductor_patches
        on_top = f" on top of {choice.on_top_of}" if choice.on_top_of else ""
        if added:
            on_top += f"; measured before {', '.join(added)} joined the base list, which change nothing here"
        if record is None:
            ctx.notes.append(f"graph {signature[:12]}: pipeline choice: {choice.change}{on_top}")
            return
        ctx.notes.append(f"graph {signature[:12]}: KB pipeline choice re-verified: {choice.change}{on_top} "
                         f"({record.reason[:80]})")


def _changed_by(graph_module: torch.fx.GraphModule, base: Sequence[Pass], added: Sequence[str]) -> list[str]:
    """Which of the ``added`` passes rewrite the graph when ``base`` runs on a copy of it, up to the last of them."""
    from kopt.agent.pipeline_choice import structural_copy
    from kopt.passes.manager import run_passes

    last = max(k for k, p in enumerate(base) if p.name in added)
    records = run_passes(structural_copy(graph_module), list(base[:last + 1]))
    return [r.name for r in records if r.name in added and r.total_matches > 0]


def switched(base: Sequence[Pass], choices: Mapping[str, tuple[Any, Any]], path: Path | None) -> list[Pass]:
    """``base`` as :class:`ChosenPass` es with every choice's passes merged in, after :class:`PipelineSelect`
    (``path`` None: the choices are not verified again; the caller checks the outputs)."""
    from kopt.agent.pipeline_choice import from_candidate

    pipelines: dict[str | None, list[Pass]] = {None: list(base)}
    for signature, (candidate, _) in choices.items():
        try:
            pipelines[signature] = from_candidate(candidate).build()
        except Exception:  # noqa: BLE001 - PipelineSelect re-verifies it, fails, records why; the base runs
            continue
    union = [p.name for p in base]
    for passes in pipelines.values():
        names = [p.name for p in passes]
        for k, name in enumerate(names):
            if name in union:
                continue
            later = [n for n in names[k + 1:] if n in union]
            union.insert(union.index(later[0]) if later else len(union), name)
    wrapped = [ChosenPass(name, {key: p for key, passes in pipelines.items() for p in passes if p.name == name})
               for name in union]
    return [PipelineSelect(path, choices, base), *wrapped]
