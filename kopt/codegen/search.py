"""Find maximal fusible regions in a graph: grow from each unclaimed node while the region stays valid.

Seeds are taken from the end of the graph backwards, so a region starts at the last value of a
chain; it then absorbs neighbouring vocabulary nodes (producers and consumers) one at a time, and
keeps each only if :func:`~kopt.codegen.region.build_region` still accepts the whole set. Every
accepted region is therefore valid by construction (one row shape, at most one last-dim reduction,
no cycle through an outside node), and the regions are disjoint because a node joins one region at
most. Greedy growth is not guaranteed to find the fewest regions, only regions no single neighbour
can be added to.
"""

from __future__ import annotations

import dataclasses

import torch

from kopt.codegen.region import Region, build_region, is_candidate, is_reduction, positions, with_getitems

MIN_OPS = 2  # a single op is already one kernel in aten; fusing pays from two
_NEAR_MISS_RULES = ("two reductions", "reduction over", "reduces a value broadcast", "mixes a reduction",
                    "laid out non-contiguously")


@dataclasses.dataclass
class Search:
    """The regions found (in graph order of their first node) and the refusals worth reporting (a
    reduction kept out of one region may still head another: the reason says why they are two)."""

    regions: list[Region]
    refusals: dict[torch.fx.Node, str]


def _compute_ops(region: Region) -> int:
    return sum(1 for step in region.steps if step.op not in ("getitem", "identity"))


def _reportable(reason: str) -> bool:
    """Refusals that explain a missed fusion (the reduction rules, an output layout the generated op
    would not keep), not plain region boundaries."""
    return any(phrase in reason for phrase in _NEAR_MISS_RULES)


def find_regions(graph: torch.fx.Graph, *, min_ops: int = MIN_OPS) -> Search:
    """Disjoint maximal regions of ``graph`` with at least ``min_ops`` computing ops each."""
    position = positions(graph)
    claimed: set[torch.fx.Node] = set()
    regions: list[Region] = []
    refusals: dict[torch.fx.Node, str] = {}
    for seed in reversed(list(graph.nodes)):
        if seed in claimed or not is_candidate(seed) or not seed.users:
            continue
        start = build_region([seed], position)
        if isinstance(start, str):
            if is_reduction(seed) or _reportable(start):  # e.g. a reduction of another shape: worth naming
                refusals.setdefault(seed, start)
            continue  # other boundaries (float64, complex, integer values) are not near misses
        members = set(start.members)
        grown = True
        while grown:  # a node refused in one round may fit once others joined, so retry each round
            grown, tried = False, set()
            neighbours = {n for m in members for n in (*m.all_input_nodes, *m.users)}
            for node in sorted(neighbours - members - claimed - tried, key=position.__getitem__):
                if not is_candidate(node):
                    continue
                attempt = build_region(members | {node}, position)
                if isinstance(attempt, str):
                    tried.add(node)
                    if _reportable(attempt):
                        refusals.setdefault(node, attempt)
                    continue
                start, members, grown = attempt, set(attempt.members), True
        if _compute_ops(start) >= min_ops:
            regions.append(start)
            claimed |= set(with_getitems(members, position))
    regions.sort(key=lambda r: position[r.members[0]])
    return Search(regions, refusals)
