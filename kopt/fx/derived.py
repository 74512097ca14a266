"""Constants computed from weights at compile time, recorded with the computation that made them.

A pass that builds a constant out of other constants (``sibling-merge`` concatenates weights,
``fp8-linear`` quantizes them, ``staging`` folds a constant subgraph) does it through
:func:`derive`: the function, and the ``get_attr`` constants it read. The record lets the backend

* pass the result to the lowered graph as an input it owns, instead of baking it in;
* know which module weights each derived constant depends on (through chains: an FP8 copy of a
  merged weight depends on every sibling), so that only those are watched for changes;
* compute it again, in place, when one of them changes (a LoRA hot-swap), without capturing,
  rewriting or lowering again (:mod:`kopt.fx.weights`).

Valid because a pass's constant is a pure function of the constants it read: the same function
applied to the new weights is what the pass would have produced had it run on them (the shapes
are the same, or dynamo would have recompiled on its own guards).

A constant attached without a record (a user's pass calling ``add_constant``) is of unknown
provenance: the backend keeps it baked in and rebuilds the whole graph when any weight changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from kopt.fx.constants import add_constant, constant_value

DERIVED_KEY = "kopt_derived"  # graph_module.meta: constant name -> Derivation, in creation order

Computation = Callable[..., "torch.Tensor | Sequence[torch.Tensor]"]


@dataclasses.dataclass(frozen=True)
class Derivation:
    """How one derived constant is computed.

    Attributes:
        compute: a pure function of the source constants' values.
        sources: the ``get_attr`` names of the constants it reads, in argument order.
        output: which element of ``compute``'s result this constant is (None: the result itself).
        stacked: the result is the sources concatenated along their first dimension, in order:
            each source's values are one block of its rows, so a module weight can be a view of
            them (:mod:`kopt.fx.shared_weights`).
    """

    compute: Computation
    sources: tuple[str, ...]
    output: int | None = None
    stacked: bool = False


def derivations(graph_module: torch.fx.GraphModule) -> dict[str, Derivation]:
    """Every derivation recorded on ``graph_module`` (also of constants a later pass dropped)."""
    return graph_module.meta.setdefault(DERIVED_KEY, {})


def derive(graph_module: torch.fx.GraphModule, stems: str | Sequence[str], compute: Computation,
           sources: Sequence[torch.fx.Node], before: torch.fx.Node, *,
           stacked: bool = False) -> torch.fx.Node | list[torch.fx.Node]:
    """``compute(*values of sources)`` as new constant(s) named after ``stems``, recorded.

    One stem: ``compute`` returns one tensor and one ``get_attr`` node comes back. Several stems:
    ``compute`` returns that many tensors and a list of nodes comes back. ``stacked``: ``compute``
    concatenates its sources along the first dimension (one stem only; see :class:`Derivation`).
    """
    if stacked and not isinstance(stems, str):
        raise ValueError("a stacked derivation makes one constant")
    names = tuple(str(s.target) for s in sources)
    values = []
    for source in sources:
        value = constant_value(source)
        if value is None:
            raise ValueError(f"{source} is not a constant: nothing to derive from")
        values.append(value)
    with torch.no_grad():
        result = compute(*values)
    records = derivations(graph_module)
    if isinstance(stems, str):
        node = add_constant(graph_module, stems, result, before)
        records[str(node.target)] = Derivation(compute, names, stacked=stacked)
        return node
    nodes = []
    for index, (stem, value) in enumerate(zip(stems, result, strict=True)):
        node = add_constant(graph_module, stem, value, before)
        records[str(node.target)] = Derivation(compute, names, index)
        nodes.append(node)
    return nodes


def subgraph_computation(node: torch.fx.Node) -> tuple[torch.fx.GraphModule, list[torch.fx.Node]]:
    """The subgraph computing ``node`` from constants alone, as a module of those constants.

    Returns the module and the ``get_attr`` nodes whose values it takes, in argument order
    (what :func:`derive` needs to fold ``node`` and to fold it again later).
    """
    cone: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current in cone:
            continue
        if current.op not in ("get_attr", "call_function"):
            raise ValueError(f"{node} reads {current.op} {current}: not a constant subgraph")
        cone.add(current)
        if current.op == "call_function":
            stack.extend(current.all_input_nodes)
    ordered = [n for n in node.graph.nodes if n in cone]
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    constants = [n for n in ordered if n.op == "get_attr"]
    for constant in constants:
        env[constant] = graph.placeholder(f"c_{len(env)}")
    for current in ordered:
        if current.op == "call_function":
            env[current] = graph.node_copy(current, lambda n: env[n])
    graph.output(env[node])
    return torch.fx.GraphModule(torch.nn.Module(), graph), constants
