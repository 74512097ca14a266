"""Warm starts: order proposals by what the knowledge base learned on other models.

A region of the same class (same computation at other sizes, :attr:`Region.class_key`) tends to
prefer the same kernel parameters, and a pass that did not pay on one model of a family tends not to
pay on its sibling; so a proposal whose *lesson key* was accepted before (on another region or graph)
is tried first, one that was only ever rejected or slower goes last (an evaluation that failed
for the machine's reasons, an error, teaches nothing), the rest keep their order (a
stable sort: with an empty knowledge base the order is unchanged). This only reorders: every
candidate is still verified and measured on this model.

Lesson keys: a region candidate's region class plus its parameters; a pipeline choice's change with
the attention shape left out (``attention on math``), since shapes differ between models.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from kopt.agent.candidate import Candidate, CandidateKind

_SHAPE = re.compile(r"attention \S+ on ")


def lesson_key(candidate: Candidate, class_key: str | None) -> tuple:
    """What transfers between models: the change, not the exact region."""
    params = dict(candidate.params)
    if candidate.kind is CandidateKind.PASS_CHOICE:
        return ("pipeline", _SHAPE.sub("attention on ", str(params.get("change", ""))))
    return (candidate.kind.value, class_key, tuple(sorted((k, str(v)) for k, v in candidate.params)))


def learned(kb: Any) -> tuple[set[tuple], set[tuple]]:
    """Lesson keys accepted anywhere in ``kb``, and those never accepted but tried."""
    from kopt.agent.kb import Status

    worked, failed, classes = set(), set(), {}
    for record in kb.latest():
        signature = record.region_signature
        if signature not in classes:
            region = kb.region(signature, missing_ok=True)
            classes[signature] = region.class_key if region else None
        key = lesson_key(Candidate.from_dict(record.candidate), classes[signature])
        if record.status is Status.ERROR:  # the machine failed, not the candidate: nothing learned
            continue
        (worked if record.status is Status.ACCEPTED else failed).add(key)
    return worked, failed - worked


def warm_order(candidates: Iterable[Candidate], kb: Any, class_keys: Mapping[str, str]) -> list[Candidate]:
    """``candidates`` with those whose lesson key worked before first and failed ones last."""
    worked, failed = learned(kb)
    listed = list(candidates)

    def rank(candidate: Candidate) -> int:
        key = lesson_key(candidate, class_keys.get(candidate.region_signature))
        return 0 if key in worked else 2 if key in failed else 1

    return sorted(listed, key=rank)
