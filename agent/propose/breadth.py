"""Breadth-first order of search proposals: every family is tried once before any is tried twice.

A *family* is one region's launch variants (:mod:`kopt.agent.propose.search`) or one pipeline choice
(:mod:`kopt.agent.propose.pipeline`). The order is: every pipeline choice, then each region's first
variant (the generator's default, regions in the profile's ranking), then each region's second
variant, and so on.

Why: a budget covers a dozen or two evaluations, and variants of one kernel share its fate far more
than candidates of different families do (they differ only in launch parameters), so trying each
family once first spends the budget where the outcome is least known. Pipeline choices go before the
kernels because they cost far less to settle: a choice costs two regional compiles of a few seconds
and an A/B, 10-30 s on a full-size model, or under a second when it changes nothing; a generated
kernel is verified in the sandbox and timed alone first, 60-170 s each on an H200 (Llama-3.1-8B
prefill: three kernels took a 6.5-minute budget before any choice was tried). Regions whose profiled headroom is
under the end-to-end bar (:func:`small_regions`) go after every other family: a pipeline choice
can still pay there, a kernel for them can hardly. FP8 choices lead when their bound is the largest
(:func:`fp8_leads`). Only the order changes: with no budget limit every candidate is still evaluated.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

from kopt.agent.candidate import Candidate, CandidateKind


def breadth_first(candidates: Sequence[Candidate], small: Collection[str] = (),
                  lead: Collection[str] = ()) -> list[Candidate]:
    """``candidates``: the pipeline choices, then the region variants round-robin over families, first
    rounds first, each family's order kept; the families of regions in ``small`` (too little headroom
    to move the model: :func:`small_regions`) after all the others; the candidates whose content hash
    is in ``lead`` (:func:`fp8_leads`) before all of them, in their order."""
    first = [c for c in candidates if c.content_hash in lead]
    rest = [c for c in candidates if c.content_hash not in lead]
    choices = [c for c in rest if c.kind is CandidateKind.PASS_CHOICE]
    demoted = [c for c in rest if c.region_signature in small and c.kind is not CandidateKind.PASS_CHOICE]
    kept = [c for c in rest if not (c.region_signature in small or c.kind is CandidateKind.PASS_CHOICE)]
    return first + choices + _rounds(kept) + _rounds(demoted)


def is_fp8_choice(candidate: Candidate) -> bool:
    """A pipeline choice whose pass list runs kopt's FP8 linears (what every choice of
    :func:`kopt.agent.propose.pipeline.fp8_choices` does): read from the passes, not the words."""
    if candidate.kind is not CandidateKind.PASS_CHOICE:
        return False
    try:
        passes = json.loads(candidate.source).get("passes", ())
    except (ValueError, AttributeError):
        return False
    return "fp8-linear" in passes


def fp8_leads(candidates: Sequence[Candidate], profile: Any) -> set[str]:
    """The FP8 choices among ``candidates`` when they have the most to win, else none.

    The time outside every fusible region is the GEMMs' and attention's (the profile's regions are
    the elementwise ones :mod:`kopt.codegen` can fuse); FP8 runs them at up to twice the tensor-core
    rate, so it can win up to half that time. When that bound exceeds the headroom of every region
    (what a perfect kernel for it could win), no other family can win as much, and a budget that
    covers a dozen evaluations is best spent on the FP8 choices first (the cold run reaches the big
    wins; a warm run orders by lessons anyway, :mod:`kopt.agent.propose.warm`)."""
    total = getattr(profile, "total_s", 0.0)
    regions = getattr(profile, "regions", ())
    if not total:
        return set()
    outside = max(0.0, total - sum(r.seconds for r in regions))
    if outside / 2 <= max((r.headroom_s for r in regions), default=0.0):
        return set()
    return {c.content_hash for c in candidates if is_fp8_choice(c)}


def small_regions(profile: Any, min_gain: float) -> set[str]:
    """Regions whose profiled headroom (time above the floor, all occurrences) is under ``min_gain``
    of the profiled call: even a kernel at the floor would not reach the end-to-end bar there."""
    total = getattr(profile, "total_s", 0.0)
    if not total:
        return set()
    return {r.region.signature for r in profile.regions if r.headroom_s < min_gain * total}


def _rounds(candidates: Sequence[Candidate]) -> list[Candidate]:
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
