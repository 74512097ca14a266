"""FP8 on one group of a graph's linears: the agent's per-layer FP8 choices.

FP8 on every linear of a block rounds every GEMM input of every layer, and on an LLM with random
weights those roundings compound over the layers until the model's output misses the contract
(Gemma-2-9B: cosine 0.983 against float32 with every block linear in FP8, eager bf16's 0.9997). One
group alone adds a fraction of that error and still saves its GEMMs' time, so where FP8 on all of a
graph's linears missed the model's output contract, the agent tries each group by itself, the
largest first.

A group is the set of linears that read one activation (found through views): the siblings that
``sibling-merge`` fuses into one GEMM, which ``fp8-linear`` then quantizes all or none, so a smaller
set could not be applied. Found by what the graph computes (which GEMMs share an input), and named
by the weights' module paths, the form :attr:`kopt.fp8.config.Fp8Config.include` takes.

Why the narrowed choice waits for the miss (:func:`narrowing_unwanted`): it rounds a subset of what
the whole-graph choice rounds and saves a subset of its GEMM time, so where that choice met the
contract it is at least as good a candidate (and was judged already); only its miss makes the smaller
set worth a minute of the budget.

Where a group alone still misses, the same group in the middle blocks only (:func:`layer_spans`:
the middle three quarters, then the middle half, through :attr:`kopt.fp8.config.Fp8Config.blocks`)
rounds fewer layers again, and leaves the first and last ones, where a perturbation travels furthest
or reaches the output unfiltered, in bf16. Proposed only where the model has one class of repeated
blocks, so a block's position is its layer, and tried only after that group in every block missed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from kopt.agent.candidate import Candidate
from kopt.agent.fp8_dominance import fp8_linear_options, missed_model_contract, pipeline_choice_of

aten = torch.ops.aten
_GEMMS = (aten.mm.default, aten.addmm.default, aten.bmm.default)


@dataclasses.dataclass(frozen=True)
class LinearGroup:
    """Linears reading one activation: their weights' module paths and their GEMMs' FLOPs per call."""

    paths: tuple[str, ...]
    flops: int


def _source(node: torch.fx.Node) -> torch.fx.Node:
    """``node`` with the views in front of it taken off: the activation itself."""
    from kopt.fx.graph_utils import RESHAPES

    while node.op == "call_function" and node.target in RESHAPES and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def linear_groups(graph_module: torch.fx.GraphModule, config: Any) -> list[LinearGroup]:
    """The linears of ``graph_module`` that ``config`` (an :class:`kopt.fp8.config.Fp8Config`) would
    quantize, grouped by the activation they read, largest GEMM work first; linears without a module
    path (a constant kopt computed) are left out, since no include pattern can name them."""
    from kopt.fx.constants import constant_value, weight_paths
    from kopt.fx.graph_utils import meta_value
    from kopt.fx.symbolic import static_int
    from kopt.passes.fp8.linear import activation_of, match

    groups: dict[torch.fx.Node, tuple[list[str], int]] = {}
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node.target not in _GEMMS:
            continue
        weight = match(node, config)
        if not isinstance(weight, torch.fx.Node):
            continue
        paths = weight_paths(weight)
        if not paths:
            continue
        activation = activation_of(node)
        x, value = meta_value(activation), constant_value(weight)
        rows = static_int(x.numel() // x.shape[-1]) if x is not None else None
        flops = 2 * (rows or 1) * value.shape[0] * value.shape[1]
        found, total = groups.get(_source(activation), ([], 0))
        groups[_source(activation)] = ([*found, *paths], total + flops)
    ordered = sorted(groups.values(), key=lambda group: -group[1])
    return [LinearGroup(tuple(paths), flops) for paths, flops in ordered]


def narrowed(config: Any, group: LinearGroup) -> Any:
    """``config`` quantizing only ``group``'s linears (its skip patterns kept)."""
    return dataclasses.replace(config, include=group.paths, attention=False)


GROUP = "group"  # the marker in a narrowed choice's fp8-linear options (its config alone cannot tell:
# a user's Fp8Config may have include patterns of its own)


def group_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """A narrowed choice's pass options: ``options`` (:func:`kopt.agent.pipeline_choice.fp8_options`
    of its config) marked as one group's, which the compile ignores and :func:`is_narrowed` reads."""
    return {**options, GROUP: True}


def _options(candidate: Candidate) -> Mapping[str, Any] | None:
    choice = pipeline_choice_of(candidate)
    return fp8_linear_options(choice) if choice is not None else None


def _fp8(candidate: Candidate) -> Mapping[str, Any] | None:
    options = _options(candidate)
    return options.get("fp8") if options is not None else None


def is_narrowed(candidate: Candidate) -> bool:
    """Whether ``candidate`` is an FP8 choice for one group of its graph's linears (:func:`group_options`)."""
    options = _options(candidate)
    return options is not None and options.get(GROUP) is True


def narrowing_unwanted(candidate: Candidate, records: Iterable[Any]) -> str | None:
    """Why ``candidate``, a narrowed FP8 choice, is not worth evaluating yet (module docstring), or None
    when a choice of FP8 on all of its graph's linears at its granularity, attention left in bf16 as
    the narrowed choice leaves it, missed the model's output contract (``records``: this graph's
    evaluations in this environment)."""
    config = _fp8(candidate)
    if config is None or not is_narrowed(candidate):
        return None
    if config.get("blocks") is not None:  # a group in some layers: after that group in every layer missed
        for record in records:
            recorded = Candidate.from_dict(record.candidate)
            other = _fp8(recorded)
            if (other is not None and is_narrowed(recorded) and other.get("blocks") is None
                    and other.get("include") == config.get("include")
                    and other.get("granularity") == config.get("granularity")
                    and missed_model_contract(record.verification)):
                if _graph_missed(record.verification):  # one block's graph already misses: fewer cannot help
                    return (f"FP8 on {', '.join(config.get('include') or [])} missed its block graph's own "
                            "check, which holds in any block it runs in")
                return None
        return (f"FP8 on {', '.join(config.get('include') or [])} in every block has not missed the model's output "
                "contract: it is tried in fewer blocks only after it does")
    for record in records:
        other = _fp8(Candidate.from_dict(record.candidate))
        if (other is not None and not is_narrowed(Candidate.from_dict(record.candidate))
                and other.get("granularity") == config.get("granularity") and not other.get("attention")
                and missed_model_contract(record.verification)):  # like with like: linears only
            return None
    return (f"FP8 with {config.get('granularity')} scales on all of this graph's linears has not missed the "
            "model's output contract: a group of them is tried only after it does")


def _graph_missed(verification: Mapping[str, Any] | None) -> bool:
    """Whether a choice's check of a graph on its own (not the model's output) failed."""
    checks = verification.get("checks", ()) if isinstance(verification, Mapping) else ()
    return any(check.get("graph") != "model" and not check.get("ok") for check in checks)


def group_changes(groups: Sequence[LinearGroup], granularity: str) -> list[tuple[LinearGroup, str]]:
    """Each group with the words its choice records as its change."""
    return [(group, f"fp8 {granularity} scales on {', '.join(group.paths)} only") for group in groups]


def layer_spans(blocks: int) -> list[tuple[int, ...]]:
    """The middle three quarters, then the middle half, of ``blocks`` layers (positions from 0);
    none for fewer than 8 layers, where a quarter is one or two blocks."""
    if blocks < 8:
        return []
    return [tuple(range(blocks // d, blocks - blocks // d)) for d in (8, 4)]


def span_change(group: LinearGroup, granularity: str, span: Sequence[int], blocks: int) -> str:
    """The words a group's choice in ``span`` of ``blocks`` layers records as its change."""
    return f"fp8 {granularity} scales on {', '.join(group.paths)} only, in blocks {span[0]}-{span[-1]} of {blocks}"


def narrowed_after_whole(candidates: Sequence[Candidate]) -> list[Candidate]:
    """``candidates`` in their order, but each narrowed FP8 choice right after the last FP8 choice on
    all of its graph's linears (at the end where there is none), so that the verdict it waits for
    (:func:`narrowing_unwanted`) is in before the loop reaches it, whatever order the lessons asked for;
    a group in some layers only after every group in all layers, whose verdicts it waits for."""
    narrowed_ones = sorted((c for c in candidates if is_narrowed(c)),
                           key=lambda c: (_fp8(c) or {}).get("blocks") is not None)  # stable: groups first
    rest = [c for c in candidates if not is_narrowed(c)]
    for candidate in narrowed_ones:
        whole = [i for i, c in enumerate(rest) if c.region_signature == candidate.region_signature
                 and _fp8(c) is not None]
        at = whole[-1] + 1 if whole else len(rest)
        while at < len(rest) and is_narrowed(rest[at]) and rest[at].region_signature == candidate.region_signature:
            at += 1  # after the narrowed ones placed before it: they keep their order (largest group first)
        rest.insert(at, candidate)
    return rest
