"""Breadth-first order of search proposals: every family is tried once before any is tried twice.

A *family* is one region's launch variants (:mod:`kopt.agent.propose.search`) or one pipeline choice
(:mod:`kopt.agent.propose.pipeline`). The order is: each region's first variant (the generator's
default, regions in the profile's ranking), then every pipeline choice, then each region's second
variant, and so on.

Why: an end-to-end evaluation costs about a minute on a full-size model, so a budget covers a dozen
candidates, and variants of one kernel share its fate far more than candidates of different
families do (on LTX-Video, s14a: the three launch variants of one region measured 0.989-0.995x end
to end, all slower, while no attention backend or pass choice had been tried). Trying each family
once first spends the budget where the outcome is least known. Only the order changes: with no
budget limit every candidate is still evaluated.
"""

from __future__ import annotations

from collections.abc import Sequence

from kopt.agent.candidate import Candidate, CandidateKind


def breadth_first(candidates: Sequence[Candidate]) -> list[Candidate]:
    """``candidates`` round-robin over families, first rounds first, each family's order kept."""
    families: dict[tuple, list[Candidate]] = {}
    for candidate in candidates:
        if candidate.kind is CandidateKind.PASS_CHOICE:
            key = ("pipeline", candidate.content_hash)
        else:
            key = ("region", candidate.region_signature, candidate.kind.value)
        families.setdefault(key, []).append(candidate)
    ordered, depth = [], 0
    while len(ordered) < len(candidates):
        for members in families.values():
            if depth < len(members):
                ordered.append(members[depth])
        depth += 1
    return ordered
