"""A deterministic cost model of a GPU, for CPU tests only: the loop's decisions without a flaky clock.

Wall-clock timing on a shared 2-core machine varies by more than the 1% the loop must resolve, so
tests ask for this model by name (``clock=CostModelClock(...)`` in :mod:`kopt.agent.bench`); nothing
uses it unless asked, and every number it produces is labelled ``cost-model`` in the KB.

The model: every node of the graph that launches a kernel costs ``launch_s`` plus its roofline time
(its own bytes and FLOPs, :mod:`kopt.agent.floor`) on the nominal ceilings of :data:`NOMINAL_GPU`
(H100/H200-class: 800 TFLOP/s, 3 TB/s, 4 us per launch); views and getitems are free. A region
replaced by a candidate costs one launch plus the region's floor times the candidate's efficiency:
a generated kernel reaches the floor within 15%, worse when its launch parameters fit the row poorly
(too few elements per program to hide latency, or warps far from one per 256 elements).

Attention costs its FLOPs (4·B·H·L·S·E) and its q, k, v and output bytes at the backend's assumed
efficiency (:data:`ATTENTION_EFFICIENCY`: cuDNN a little ahead of flash, memory-efficient behind);
the math backend is three kernels and moves the B·H·L·S score matrix through memory three times
(fp32). A graph under a pipeline choice is costed as that choice's passes rewrite it.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import random
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kopt.agent.candidate import Candidate, CandidateKind
from kopt.agent.floor import Ceilings, node_bytes, node_flops, region_floor

NOMINAL_GPU = Ceilings(800e12, 3.0e12, "cost-model (nominal H100/H200-class ceilings)")
ATTENTION_EFFICIENCY = {"cudnn": 0.95, "flash": 1.0, "efficient": 1.15}
_FREE = {"view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t", "unsqueeze", "squeeze",
         "slice", "select", "alias", "detach", "split", "split_with_sizes", "unbind", "as_strided"}


def _is_free(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target is operator.getitem:
        return True
    packet = getattr(node.target, "overloadpacket", None)
    return packet is not None and packet.__name__ in _FREE


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Deterministic time of a graph, and of a region with or without a candidate."""

    ceilings: Ceilings = NOMINAL_GPU
    launch_s: float = 4e-6

    def node_s(self, node: torch.fx.Node) -> float:
        if _is_free(node):
            return 0.0
        from kopt.agent.sdpa_backend import SDPA_OP, attention_backend

        backend = node.args[-1] if node.target is SDPA_OP else attention_backend(node)
        if backend is not None:
            return self.attention_s(node, backend)
        return self.launch_s + self.ceilings.floor_s(node_flops(node), node_bytes(node))

    def attention_s(self, node: torch.fx.Node, backend: str) -> float:
        q, k, v = (a.meta["val"] for a in node.args[:3])
        scores = math.prod(q.shape[:-1]) * k.shape[-2]
        flops = 2.0 * scores * (q.shape[-1] + v.shape[-1])
        moved = sum(t.numel() * t.element_size() for t in (q, k, v)) + math.prod(q.shape[:-1]) * v.shape[-1] * 4
        if backend == "math":
            return 3 * self.launch_s + self.ceilings.floor_s(flops, moved + 3 * scores * 4)
        return self.launch_s + self.ceilings.floor_s(flops, moved) * ATTENTION_EFFICIENCY[backend]

    def graph_s(self, graph_module: torch.fx.GraphModule) -> float:
        return sum(self.node_s(n) for n in graph_module.graph.nodes)

    def occurrence_s(self, occurrence: Any) -> float:
        return sum(self.node_s(n) for n in occurrence.members)

    def candidate_s(self, occurrence: Any, candidate: Candidate) -> float:
        floor = region_floor(occurrence.region, self.ceilings).seconds
        return self.launch_s + floor * self.efficiency(occurrence, candidate)

    def efficiency(self, occurrence: Any, candidate: Candidate) -> float:
        """How far above the floor the candidate's kernel runs (1.0 = at the floor)."""
        if candidate.kind is not CandidateKind.CODEGEN_VARIANT or occurrence.fusible is None:
            return 1.2
        params = dict(candidate.params)
        n = occurrence.fusible.full_shape[-1]
        rows = math.prod(occurrence.fusible.full_shape[:-1])
        block_n = 1 << max(0, (n - 1).bit_length())
        block_r = min(1 << max(0, (rows - 1).bit_length()), max(1, int(params.get("row_budget", 2048)) // block_n))
        elements = block_r * block_n
        warps = params.get("num_warps", "auto")
        if warps == "auto":
            warps = 4 if elements <= 2048 else 8 if elements <= 8192 else 16
        ideal = min(16, max(1, elements // 256))
        penalty = 1.15 + 0.1 * abs(math.log2(int(warps) / ideal))
        if elements < 256 and rows > block_r:
            penalty += 0.3  # many tiny programs: latency not hidden
        return penalty

    def model_s(self, graphs: Sequence[Any], occurrences: Sequence[Any], chosen: Mapping[str, Candidate],
                rewritten: Mapping[int, tuple[torch.fx.GraphModule, Sequence[Any]]] | None = None) -> float:
        """The whole model's time with the regions in ``chosen`` replaced by their candidates;
        ``rewritten``: graph index -> (graph, its occurrences) for graphs under a pipeline choice."""
        rewritten = rewritten or {}
        total = 0.0
        for graph in graphs:
            module, found = rewritten.get(graph.index, (graph.graph_module, None))
            seconds = self.graph_s(module)
            if found is None:
                found = [o for o in occurrences if o.graph_index == graph.index]
            for occurrence in found:
                candidate = chosen.get(occurrence.region.signature)
                if candidate is not None and candidate.kind is not CandidateKind.PASS_CHOICE:
                    seconds += self.candidate_s(occurrence, candidate) - self.occurrence_s(occurrence)
            total += seconds * getattr(graph, "calls", 1)  # a block class's graph runs once per block
        return total


@dataclasses.dataclass
class CostModelClock:
    """Samples of :class:`CostModel` times with seeded multiplicative noise (``noise`` relative s.d.),
    so the bootstrap sees a spread like a quiet GPU's; deterministic given ``seed``."""

    graphs: Sequence[Any]
    occurrences: Sequence[Any]
    model: CostModel = dataclasses.field(default_factory=CostModel)
    noise: float = 0.003
    seed: int = 0
    name: str = "cost-model"

    def __post_init__(self) -> None:
        self._rewritten: dict[tuple[int, str], tuple[torch.fx.GraphModule, list[Any]]] = {}
        self._seconds: dict[tuple[str, ...], float] = {}

    def rewritten(self, chosen: Mapping[str, Candidate]) -> dict[int, tuple[torch.fx.GraphModule, list[Any]]]:
        """The graphs a pipeline choice in ``chosen`` rewrites, with their occurrences (cached)."""
        from kopt.agent.bench import pipeline_choice_for
        from kopt.agent.pipeline_choice import from_candidate, run_choice
        from kopt.agent.profile import find_occurrences

        found = {}
        for graph in self.graphs:
            choice = pipeline_choice_for(graph, chosen)
            if choice is None:
                continue
            key = (graph.index, choice.content_hash)
            if key not in self._rewritten:
                module = run_choice(graph.original, from_candidate(choice), graph.index)
                self._rewritten[key] = (module, find_occurrences(module, graph.index))
            found[graph.index] = self._rewritten[key]
        return found

    def seconds(self, chosen: Mapping[str, Candidate]) -> float:
        """The model's modelled time with ``chosen`` (cached: the model is deterministic)."""
        key = tuple(sorted(c.content_hash for c in chosen.values()))
        if key not in self._seconds:
            self._seconds[key] = self.model.model_s(self.graphs, self.occurrences, chosen, self.rewritten(chosen))
        return self._seconds[key]

    def samples(self, chosen: Mapping[str, Candidate], count: int, stream: int) -> list[float]:
        base = self.seconds(chosen)
        rng = random.Random(self.seed * 1_000_003 + stream)
        return [base * (1.0 + rng.gauss(0.0, self.noise)) for _ in range(count)]


def modelled_profile(graphs: Sequence[Any], occurrences: Sequence[Any], model: CostModel | None = None) -> Any:
    """A :class:`kopt.agent.profile.Profile` in the cost model's terms (deterministic ranking for tests)."""
    from kopt.agent.profile import Profile, RegionProfile, rank

    model = model or CostModel()
    grouped: dict[str, list[Any]] = {}
    for occurrence in occurrences:
        grouped.setdefault(occurrence.region.signature, []).append(occurrence)
    calls = {g.index: getattr(g, "calls", 1) for g in graphs}
    regions = [RegionProfile(found[0].region, sum(calls.get(o.graph_index, 1) for o in found),
                             sum(model.occurrence_s(o) * calls.get(o.graph_index, 1) for o in found),
                             region_floor(found[0].region, model.ceilings)) for found in grouped.values()]
    total = sum(model.graph_s(g.graph_module) * calls[g.index] for g in graphs)
    return Profile(tuple(rank(regions)), total, model.ceilings, "cost-model")
