"""Pipeline choices that change nothing, settled without the end-to-end A/B.

A default pass left out that never fired on a graph, or an opt-in pass added that matches nothing
in it, leaves the graph exactly as the baseline pipeline makes it. Such a choice cannot change the
model's time, so timing it (a whole-model lowering and 2 x 20 calls, about a minute and a half on a
video DiT) only spends the budget; it is recorded as not faster, with this reason, and never timed.

Why the test is sound: two graph modules with the same generated code that read equal constants
(same shape, dtype, strides and values; shared storage counts as equal) run the same ops on the same
values, so they lower to the same kernels. The test errs toward timing: graphs that compute the
same thing but differ in a node's name or order are not called unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kopt.agent.candidate import Candidate, CandidateKind


def _constant(module: torch.fx.GraphModule, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _equal_constants(first: Any, second: Any) -> bool:
    if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor):
        if (first.shape, first.dtype, first.stride(), first.device) != (second.shape, second.dtype, second.stride(),
                                                                      second.device):
            return False
        same_storage = (first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
                        and first.storage_offset() == second.storage_offset())
        return same_storage or bool(torch.equal(first, second))
    if isinstance(first, torch.Tensor) or isinstance(second, torch.Tensor):
        return False
    return type(first) is type(second)  # submodules: their code is part of the graph's text only by name


def same_graph(first: torch.fx.GraphModule, second: torch.fx.GraphModule) -> bool:
    """Whether both modules run the same generated code on equal constants (module docstring)."""
    if first.code != second.code:
        return False
    targets = [n.target for n in first.graph.nodes if n.op == "get_attr"]
    return all(_equal_constants(_constant(first, t), _constant(second, t)) for t in targets)


def changes_nothing(graphs: Sequence[Any], accepted: Mapping[str, Candidate], candidate: Candidate) -> str:
    """Why ``candidate`` (a pipeline choice) leaves its graph as ``accepted`` makes it; empty if it
    changes something or is not a pipeline choice."""
    from kopt.agent.bench import applied_one

    if candidate.kind is not CandidateKind.PASS_CHOICE:
        return ""
    graph = next((g for g in graphs if g.signature == candidate.region_signature), None)
    if graph is None:
        return ""
    baseline = applied_one(graph, accepted)  # first: the candidate's rewrite stays cached for the A/B
    trial = applied_one(graph, {**accepted, candidate.region_signature: candidate})
    if not same_graph(baseline, trial):
        return ""
    change = dict(candidate.params).get("change", "the choice")
    return (f"changes nothing: with {change!r} graph {graph.index} is the baseline's graph (same code, equal "
            "constants), so it cannot be faster; not timed")
