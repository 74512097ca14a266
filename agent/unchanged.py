"""Candidates that change nothing, settled without the end-to-end A/B.

A default pass left out that never fired on a graph, or an opt-in pass added that matches nothing
in it, leaves the graph exactly as the baseline pipeline makes it. So does a region candidate whose
region no longer occurs once the accepted pipeline choice rewrote the graph (FP8 linears replace
the bf16 regions the candidate was made for). Such a candidate cannot change the model's time, so
verifying and timing it only spends the budget; it is recorded as not faster, with this reason, and
never timed.

Why the test is sound: two graph modules with the same generated code that read equal constants
(same shape, dtype, strides and values; shared storage counts as equal) run the same ops on the same
values, so they lower to the same kernels, unless the choice lowers them with other Inductor
patches (then it is always timed). The test errs toward timing: graphs that compute the same thing
but differ in a node's name or order are not called unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kopt.agent.candidate import Candidate, CandidateKind
from kopt.fx.constants import constant_value


def _equal_constants(first: torch.Tensor | None, second: torch.Tensor | None) -> bool:
    """Same shape, dtype, strides, device and values (shared storage counts as equal); a ``get_attr``
    that is not a tensor is never called equal (the test errs toward timing)."""
    if first is None or second is None:
        return False
    if (first.shape, first.dtype, first.stride(), first.device) != (second.shape, second.dtype, second.stride(),
                                                                  second.device):
        return False
    same_storage = (first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
                    and first.storage_offset() == second.storage_offset())
    return same_storage or bool(torch.equal(first, second))


def same_graph(first: torch.fx.GraphModule, second: torch.fx.GraphModule) -> bool:
    """Whether both modules run the same generated code on equal constants (module docstring)."""
    if first.code != second.code:
        return False
    pairs = zip((n for n in first.graph.nodes if n.op == "get_attr"),
                (n for n in second.graph.nodes if n.op == "get_attr"), strict=True)
    return all(_equal_constants(constant_value(a), constant_value(b)) for a, b in pairs)


def changes_nothing(graphs: Sequence[Any], accepted: Mapping[str, Candidate], candidate: Candidate) -> str:
    """Why ``candidate`` leaves every graph as ``accepted`` makes it; empty if it changes something."""
    from kopt.agent.bench import applied_one, lowering_patches

    if candidate.kind is not CandidateKind.PASS_CHOICE:
        from kopt.agent.profile import find_occurrences

        trial_chosen = {**accepted, candidate.region_signature: candidate}
        baselines = [applied_one(g, accepted) for g in graphs]
        if any(not same_graph(b, applied_one(g, trial_chosen)) for b, g in zip(baselines, graphs, strict=True)):
            return ""
        under = [dict(c.params).get("change", "") for c in accepted.values() if c.kind is CandidateKind.PASS_CHOICE]
        graphs_text = f"the accepted choices ({'; '.join(under)}) make" if under else "the baseline makes"
        present = any(o.region.signature == candidate.region_signature for b in baselines for o in find_occurrences(b))
        where = ("occurs there only where the model lays its outputs out otherwise than the region it was "
                 "verified for (kopt.agent.apply.layout_agrees)" if present else "occurs nowhere")
        return (f"changes nothing: region {candidate.region_signature[:12]} {where} in the graphs as {graphs_text} "
                "them, so it cannot be faster; not verified or timed")
    graph = next((g for g in graphs if g.signature == candidate.region_signature), None)
    if graph is None:
        return ""
    trial_chosen = {**accepted, candidate.region_signature: candidate}
    if lowering_patches(graph, trial_chosen) != lowering_patches(graph, accepted):
        return ""  # lowered another way: the same graph can still run other kernels
    baseline = applied_one(graph, accepted)  # first: the candidate's rewrite stays cached for the A/B
    trial = applied_one(graph, trial_chosen)
    if not same_graph(baseline, trial):
        return ""
    change = dict(candidate.params).get("change", "the choice")
    return (f"changes nothing: with {change!r} graph {graph.index} is the baseline's graph (same code, equal "
            "constants), so it cannot be faster; not timed")
