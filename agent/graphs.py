"""The graphs the agent works on: a model's captured FX graphs after the hand passes, with real inputs.

The loop profiles and searches the graph that kopt would lower, at the point where the knowledge
base's rewrites are applied (:mod:`kopt.agent.apply`): after every pass of ``passes="auto"`` but
``staging`` (staging folds and hoists node by name; applying a candidate before it keeps both
valid). :func:`capture_graphs` runs the model once through a dynamo backend of its own that captures
each graph exactly like kopt's backend (:func:`kopt.fx.capture.capture`), runs those passes, keeps
the graph with the real arguments of that call, and runs the original graph (nothing is lowered).

``regional=True`` captures as ``kopt.compile(regional=True)`` does (:mod:`kopt.regional`): dynamo
on each repeated block, so one graph per block class (with the first instance's weights and
arguments) and ``calls``, how many times the forward runs it; the code between blocks runs eagerly
and is no graph, but for the large linears there with ``between_blocks="linears"`` (an LLM's LM head:
a graph of its own, where an FP8 choice can reach it). The graphs, their signatures and their
regions are then those the regional compile's passes see, which is where the knowledge base's
findings apply.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from kopt.fx.capture import capture
from kopt.fx.roles import classify_inputs
from kopt.passes.base import Pass


@dataclasses.dataclass
class ProbedGraph:
    """One captured graph after the passes, the real arguments its placeholders had, and the graph
    before any pass (``original``: what a pipeline choice rewrites; it shares the weights)."""

    graph_module: torch.fx.GraphModule
    args: list[Any]
    index: int
    original: torch.fx.GraphModule | None = None
    calls: int = 1  # how many times one call of the model runs this graph (a block class: once per block)
    _signature: str | None = dataclasses.field(default=None, repr=False)
    choice_graphs: dict[str, torch.fx.GraphModule] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def signature(self) -> str:
        """The signature of the graph before any pass (:func:`kopt.agent.pipeline_choice.graph_signature`)."""
        if self._signature is None:
            from kopt.agent.pipeline_choice import graph_signature

            self._signature = graph_signature(self.original if self.original is not None else self.graph_module)
        return self._signature


def passes_before_staging(extra: Sequence[Pass] = ()) -> list[Pass]:
    """``passes="auto"`` without ``staging``, then ``extra`` (the point where KB rewrites apply)."""
    from kopt.passes.pipeline import default_pipeline

    return [p for p in default_pipeline() if p.name != "staging"] + list(extra)


def call(model: Callable[..., Any], inputs: Sequence[Any] | Mapping[str, Any]) -> Any:
    """``model(**inputs)`` for a mapping, ``model(*inputs)`` for a sequence."""
    return model(**inputs) if isinstance(inputs, Mapping) else model(*inputs)


def capture_graphs(model: torch.nn.Module, example_inputs: Sequence[Any] | Mapping[str, Any],
                   passes: Sequence[Pass] | None = None, *, regional: bool = False,
                   between_blocks: str = "eager") -> list[ProbedGraph]:
    """Every graph dynamo finds in one call of ``model``, captured and rewritten by ``passes``
    (default :func:`passes_before_staging`), with the call's real user arguments; ``regional``: one
    graph per repeated block class instead (module docstring), and with ``between_blocks="linears"``
    one per large linear between the blocks (:func:`kopt.regional.linears_between_blocks`)."""
    from kopt.agent.pipeline_choice import structural_copy
    from kopt.dynamo_cache import compile_isolated
    from kopt.passes.manager import run_passes
    from kopt.regional import compile_blocks, uncompile_blocks

    found: list[ProbedGraph] = []
    passes = list(passes_before_staging() if passes is None else passes)
    names = () if regional else _argument_names(model)  # as kopt's regional backend names block inputs

    def backend(dynamo_graph: torch.fx.GraphModule, example: list[Any]) -> Callable[..., Any]:
        placeholders = [n for n in dynamo_graph.graph.nodes if n.op == "placeholder"]
        roles = classify_inputs(placeholders, example, {}, names)
        captured = capture(dynamo_graph, example, roles, in_dynamo=True)
        original = structural_copy(captured.graph_module)
        run_passes(captured.graph_module, passes, graph_index=len(found))
        probed = ProbedGraph(captured.graph_module, list(captured.user_args(example)), len(found), original, calls=0)
        found.append(probed)

        def counted(*args: Any) -> Any:
            probed.calls += 1
            return dynamo_graph.forward(*args)

        return counted

    with torch.no_grad():
        if regional:
            compile_blocks(model, backend, dynamic=False, between_blocks=between_blocks)
            try:
                call(model, example_inputs)
            finally:
                uncompile_blocks(model)
        else:
            call(compile_isolated(model, backend, fullgraph=False, dynamic=False), example_inputs)
    return found


def _argument_names(model: Callable[..., Any]) -> tuple[str, ...]:
    from kopt.api import _argument_names as names

    return names(model.forward if isinstance(model, torch.nn.Module) else model)


def lone_gemm(graph: ProbedGraph) -> bool:
    """Whether the graph holds exactly one GEMM (a linear between the blocks, ``between_blocks="linears"``)."""
    from kopt.agent.tuning_cost import GEMM_OPS

    return sum(n.op == "call_function" and n.target in GEMM_OPS for n in graph.graph_module.graph.nodes) == 1


def without_minor_gemms(graphs: Sequence[ProbedGraph], min_share: float) -> list[ProbedGraph]:
    """``graphs`` less those that are one GEMM (:func:`lone_gemm`) whose FLOPs, times the calls per
    model call, are under ``min_share`` of all the graphs' FLOPs.

    Amdahl: a choice for such a graph saves at most the graph's time, and a lone GEMM's time follows
    its FLOPs, so under ``min_share`` of the model's work it cannot make the model ``min_share`` faster
    (a DiT's modulation linear runs one row per call; its text projection, a few hundred)."""
    from kopt.agent.floor import node_flops

    def flops(graph: ProbedGraph) -> float:
        return graph.calls * sum(node_flops(n) for n in graph.graph_module.graph.nodes)

    total = sum(flops(g) for g in graphs)
    return [g for g in graphs if not (lone_gemm(g) and total > 0 and flops(g) < min_share * total)]
