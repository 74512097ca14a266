"""Warm starts: order proposals by what the knowledge base learned on other models.

A region of the same class (same computation at other sizes, :attr:`Region.class_key`) tends to
prefer the same kernel parameters, and a pass that did not pay on one model of a family tends not to
pay on its sibling; so a proposal whose *lesson key* was accepted before (on another region or graph)
is tried first, one that was only ever rejected or slower goes after the untried ones of its kind
(an evaluation that failed for the machine's reasons, an error, teaches nothing), the rest keep
their order (a stable sort: with an empty knowledge base the order is unchanged). A pipeline choice
that failed on another model still goes before any untried kernel: it settles in seconds where a
kernel takes minutes (on Llama-3.1-8B, choices that failed on LTX-Video went behind every kernel,
and three budgets went to kernels). This only reorders: every
candidate is still verified and measured on this model.

Among the proposals that worked before, the one accepted deepest goes first: a choice accepted on a
graph on top of k choices kept before it there (its depth, k) was measured better than where those k
had taken that graph, so the deepest is the best state another model reached that one proposal can
carry. An FP8 choice carries the whole FP8 configuration (granularity and attention), so proposing
"row scales + FP8 attention" first reaches in one evaluation what took three (tensor scales, then row
scales on top, then FP8 attention on top); the shallower ones are then measured on top of it.

Lesson keys: a region candidate's region class plus its parameters; a pipeline choice's change with
the attention shape left out (``attention on math``), since shapes differ between models.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from kopt.agent.candidate import Candidate, CandidateKind

_SHAPE = re.compile(r"^attention .* on ")  # the shape key holds spaces: "q[1, 24, 4352, 128]k[...]bfloat16"


def lesson_key(candidate: Candidate, class_key: str | None) -> tuple:
    """What transfers between models: the change, not the exact region."""
    params = dict(candidate.params)
    if candidate.kind is CandidateKind.PASS_CHOICE:
        return ("pipeline", _SHAPE.sub("attention on ", str(params.get("change", ""))))
    return (candidate.kind.value, class_key, tuple(sorted((k, str(v)) for k, v in candidate.params)))


def learned(kb: Any) -> tuple[dict[tuple, int], set[tuple]]:
    """Lesson keys accepted anywhere in ``kb`` with the deepest each was accepted at (the number of
    candidates accepted on that region or graph before it), and those never accepted but tried."""
    from kopt.agent.kb import Status

    worked: dict[tuple, int] = {}
    failed, classes, kept = set(), {}, {}
    for record in kb.latest():  # oldest first: what was kept on a graph before each record
        signature = record.region_signature
        if signature not in classes:
            region = kb.region(signature, missing_ok=True)
            classes[signature] = region.class_key if region else None
        key = lesson_key(Candidate.from_dict(record.candidate), classes[signature])
        if record.status is Status.ERROR:  # the machine failed, not the candidate: nothing learned
            continue
        if record.status is Status.ACCEPTED:
            depth = kept.get((record.environment_key, signature), 0)
            kept[(record.environment_key, signature)] = depth + 1
            worked[key] = max(worked.get(key, 0), depth)
        else:
            failed.add(key)
    return worked, failed - set(worked)


def warm_order(candidates: Iterable[Candidate], kb: Any, class_keys: Mapping[str, str]) -> list[Candidate]:
    """``candidates`` with those whose lesson key worked before first (the deepest accepted first); of
    the rest, the pipeline choices before the kernels (:mod:`kopt.agent.propose.breadth`: a choice
    settles in seconds, a kernel in minutes), each with the ones that failed before last."""
    worked, failed = learned(kb)
    listed = list(candidates)

    def rank(candidate: Candidate) -> tuple[int, int, int]:
        key = lesson_key(candidate, class_keys.get(candidate.region_signature))
        if key in worked:
            return (0, -worked[key], 0)
        kernel = int(candidate.kind is not CandidateKind.PASS_CHOICE)
        return (1, kernel, int(key in failed))

    return sorted(listed, key=rank)
