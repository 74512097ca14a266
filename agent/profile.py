"""Where the time goes: time per FX region of a captured graph, its floor, and the regions worth work.

Attribution: the graph runs node by node (:class:`torch.fx.Interpreter`) under
:mod:`torch.profiler`, each node of a region inside ``record_function("kopt-region:<k>")``. The
profiler attributes every kernel to the range that launched it, so a region's time is its ranges'
device time on a GPU (``device_time_total``: kernels, not launch overhead) and their CPU time on the
CPU; the same code runs unchanged on both. Node by node is how the graph runs without fusion,
which is the baseline a candidate must beat.

Ranking (:func:`rank`): a region that occurs k times with time t per occurrence and floor f can
win at most k x (t - f) per call, so regions are ordered by that bound, largest first.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from kopt.agent.floor import Ceilings, Floor, measured_ceilings, region_floor
from kopt.agent.region import Region, from_codegen

LABEL = "kopt-region:"


@dataclasses.dataclass(frozen=True)
class Occurrence:
    """One place a region occurs: the agent region and the graph nodes it covers."""

    region: Region
    members: tuple[torch.fx.Node, ...]
    graph_index: int
    fusible: Any = None  # the kopt.codegen region behind it (what codegen variants generate from)


def find_occurrences(graph_module: torch.fx.GraphModule, graph_index: int = 0, *,
                     model: str | None = None) -> list[Occurrence]:
    """Every region :mod:`kopt.codegen` can fuse in the graph, with its member nodes."""
    from kopt.codegen.region import positions, with_getitems
    from kopt.codegen.search import find_regions

    graph = graph_module.graph
    found = []
    for region in find_regions(graph).regions:
        members = tuple(with_getitems(set(region.members), positions(graph)))
        found.append(Occurrence(from_codegen(graph_module, region, model=model), members, graph_index, region))
    return found


@dataclasses.dataclass(frozen=True)
class RegionProfile:
    """One region signature: how often it occurs per call, its time, its floor, what it could win."""

    region: Region
    occurrences: int
    seconds: float  # per call of the model, all occurrences together
    floor: Floor  # one occurrence

    @property
    def seconds_each(self) -> float:
        return self.seconds / self.occurrences

    @property
    def headroom_s(self) -> float:
        """(time - floor) x occurrences: the most a perfect replacement could win per call."""
        return max(0.0, self.seconds_each - self.floor.seconds) * self.occurrences


@dataclasses.dataclass(frozen=True)
class Profile:
    """Per-region profile of one model call, ranked by headroom; ``total_s`` is the whole graph's time."""

    regions: tuple[RegionProfile, ...]
    total_s: float
    ceilings: Ceilings
    timer: str  # "device" or "cpu": which profiler clock the times are


class _Labelled(torch.fx.Interpreter):
    def __init__(self, module: torch.fx.GraphModule, labels: dict[torch.fx.Node, str]) -> None:
        super().__init__(module)
        self.labels = labels

    def run_node(self, node: torch.fx.Node) -> Any:
        label = self.labels.get(node)
        if label is None:
            return super().run_node(node)
        with record_function(label):
            return super().run_node(node)


def _device(args: Sequence[Any]) -> torch.device:
    for value in args:
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def profile_graphs(graphs: Sequence[Any], occurrences: Sequence[Occurrence], *, repeats: int = 3,
                   ceilings: Ceilings | None = None) -> Profile:
    """Profile ``graphs`` (:class:`kopt.agent.graphs.ProbedGraph`) and attribute time to ``occurrences``."""
    device = _device(graphs[0].args) if graphs else torch.device("cpu")
    ceilings = ceilings or measured_ceilings(str(device))
    labels: dict[int, dict[torch.fx.Node, str]] = {g.index: {} for g in graphs}
    for k, occurrence in enumerate(occurrences):
        for node in occurrence.members:
            labels[occurrence.graph_index][node] = f"{LABEL}{k}"
    return _attribute(graphs, occurrences, labels, repeats, ceilings, device)


def profile_applied(graphs: Sequence[Any], modules: Sequence[torch.fx.GraphModule], occurrences: Sequence[Occurrence],
                    *, repeats: int = 3, ceilings: Ceilings | None = None) -> dict[str, float]:
    """Seconds per call of each region signature in ``modules`` (the graphs with candidates applied,
    :func:`kopt.agent.bench.applied`): a replaced region is its candidate's call, the others their nodes."""
    device = _device(graphs[0].args) if graphs else torch.device("cpu")
    probes = [dataclasses.replace(g, graph_module=m) for g, m in zip(graphs, modules, strict=True)]
    labels: dict[int, dict[torch.fx.Node, str]] = {g.index: {} for g in graphs}
    for probe in probes:
        for node in probe.graph_module.graph.nodes:
            if "kopt_agent_region" in node.meta:
                labels[probe.index][node] = f"{LABEL}{node.meta['kopt_agent_region']}"
        for occurrence in find_occurrences(probe.graph_module, probe.index):
            for node in occurrence.members:
                labels[probe.index][node] = f"{LABEL}{occurrence.region.signature}"
    seconds, _, _ = _measure(probes, labels, repeats, device)
    return {label.removeprefix(LABEL): value for label, value in seconds.items()}


def _measure(graphs: Sequence[Any], labels: dict[int, dict[torch.fx.Node, str]], repeats: int,
             device: torch.device) -> tuple[dict[str, float], float, bool]:
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    runners = [_Labelled(g.graph_module, labels[g.index]) for g in graphs]
    with torch.no_grad():
        for runner, graph in zip(runners, graphs, strict=True):  # warm-up
            runner.run(*graph.args)
        start = time.perf_counter()
        with profile(activities=activities) as prof:
            for _ in range(repeats):
                for runner, graph in zip(runners, graphs, strict=True):
                    for _ in range(graph.calls):  # a block class's graph: once per block
                        runner.run(*graph.args)
                if cuda:
                    torch.cuda.synchronize(device)
        wall = (time.perf_counter() - start) / repeats
    per_label: dict[str, float] = {}
    for event in prof.key_averages():
        if event.key.startswith(LABEL):
            total_us = event.device_time_total if cuda else event.cpu_time_total
            per_label[event.key] = total_us * 1e-6 / repeats
    return per_label, wall, cuda


def _attribute(graphs: Sequence[Any], occurrences: Sequence[Occurrence], labels: dict, repeats: int,
               ceilings: Ceilings, device: torch.device) -> Profile:
    per_label, wall, cuda = _measure(graphs, labels, repeats, device)
    by_signature: dict[str, list[tuple[Occurrence, float]]] = {}
    for k, occurrence in enumerate(occurrences):
        by_signature.setdefault(occurrence.region.signature, []).append((occurrence, per_label.get(f"{LABEL}{k}", 0.0)))
    calls = {g.index: g.calls for g in graphs}
    regions = [RegionProfile(found[0][0].region, sum(calls[o.graph_index] for o, _ in found), sum(t for _, t in found),
                             region_floor(found[0][0].region, ceilings)) for found in by_signature.values()]
    return Profile(tuple(rank(regions)), wall, ceilings, "device" if cuda else "cpu")


def rank(regions: Sequence[RegionProfile]) -> list[RegionProfile]:
    """Largest headroom first; ties by signature, so the order is deterministic."""
    return sorted(regions, key=lambda r: (-r.headroom_s, r.region.signature))
