"""Rules by example: the pattern and its replacement are two plain PyTorch functions, traced once.

Why ``torch.fx``'s ``SubgraphMatcher`` and not ``torch._inductor.pattern_matcher``: both trace
functions to ATen and match structurally, but Inductor's matcher is a private API whose
registration signatures change between torch releases (kopt supports 2.11-2.14) and it is built to
run inside Inductor's own pass loop. ``SubgraphMatcher`` only matches; kopt does the replacement
itself, so every rewrite goes through the same fuel, guard (decline-with-reason) and provenance
path as hand-written passes, and a user rule is just data.

    def pattern(x, w):          def replacement(x, w):
        return torch.relu(x @ w)    return my_fused_op(x, w)

    rule = Rule("mm-relu", pattern, replacement, example=lambda: (randn(4, 8), randn(8, 3)),
                why="relu(x @ w) is the fused op's definition")

A pattern says what is computed, not in which dtype: ``x * sigmoid(x)`` of an int64 ``x`` is the
same graph as of a float ``x`` but a different computation (integer promotion), and a replacement
written for floats is wrong there. So a rule matches only inputs of the dtype *class* (floating,
complex, integer, bool) its example inputs had, position by position, unless ``dtypes`` names the
dtypes it may match; any other match is declined with the reason (a near miss in the report).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Collection

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.utils.matcher_utils import InternalMatch, SubgraphMatcher

from kopt.fx.graph_utils import stamp
from kopt.passes.base import Contract, Pass, PassContext


@dataclasses.dataclass(frozen=True)
class Rule:
    """A pattern function, its replacement, and when it applies.

    Attributes:
        name: the rule's name in reports.
        pattern: plain PyTorch function; its inputs are wildcards.
        replacement: plain PyTorch function with the same inputs and outputs.
        example: returns example inputs to trace both functions with (shapes only matter where
            the traced graph keeps them as literals, see ``ignore_literals``).
        why: one line: why ``replacement`` computes the same as ``pattern``.
        guard: ``guard(match) -> None`` to accept or a reason string to decline one match.
        ignore_literals: match any literal (shapes in ``view``, scalars) instead of equal ones.
        dtypes: the dtypes every tensor input may have; None (default): those of the same class
            (floating, complex, integer, bool) as the example input at the same position.
    """

    name: str
    pattern: Callable[..., object]
    replacement: Callable[..., object]
    example: Callable[[], tuple[torch.Tensor, ...]]
    why: str
    guard: Callable[[InternalMatch], str | None] | None = None
    ignore_literals: bool = False
    dtypes: Collection[torch.dtype] | None = None

    @functools.cached_property
    def example_dtypes(self) -> tuple[torch.dtype | None, ...]:
        """The dtype of each example input (None for a non-tensor one)."""
        return tuple(t.dtype if isinstance(t, torch.Tensor) else None for t in self.example())

    def dtype_mismatch(self, match: InternalMatch) -> str | None:
        """Why ``match``'s inputs have dtypes this rule was not written for, or None."""
        for index, node in enumerate(match.placeholder_nodes):
            value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
            if not isinstance(value, torch.Tensor):
                continue
            if self.dtypes is not None:
                if value.dtype not in self.dtypes:
                    allowed = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.dtypes))
                    return f"input {index} is {str(value.dtype).removeprefix('torch.')}; the rule allows {allowed}"
                continue
            example = self.example_dtypes[index] if index < len(self.example_dtypes) else None
            if example is not None and dtype_class(value.dtype) != dtype_class(example):
                return (f"input {index} is {str(value.dtype).removeprefix('torch.')} ({dtype_class(value.dtype)}); "
                        f"the rule was traced on {dtype_class(example)} inputs (Rule(dtypes=...) widens it)")
        return None

    @functools.cached_property
    def pattern_graph(self) -> torch.fx.Graph:
        return _trace(self.pattern, self.example())

    @functools.cached_property
    def replacement_graph(self) -> torch.fx.Graph:
        return _trace(self.replacement, self.example())


def dtype_class(dtype: torch.dtype) -> str:
    """floating, complex, bool or integer: dtypes within a class compute the same ops alike."""
    if dtype.is_floating_point:
        return "floating"
    if dtype.is_complex:
        return "complex"
    return "bool" if dtype is torch.bool else "integer"


def _trace(fn: Callable[..., object], example: tuple[torch.Tensor, ...]) -> torch.fx.Graph:
    """``fn`` traced on the example, called with exactly the example's arguments: make_fx makes one input per
    parameter of ``fn`` itself, so ``torch.nn.functional.silu`` (``input, inplace=False``) would need two."""
    graph = make_fx(lambda *args: fn(*args))(*example).graph
    graph.eliminate_dead_code()
    return graph


def find_matches(rule: Rule, graph: torch.fx.Graph) -> list[InternalMatch]:
    """Non-overlapping occurrences of the rule's pattern in ``graph``."""
    matcher = SubgraphMatcher(rule.pattern_graph, match_output=False, match_placeholder=False,
                              remove_overlapping_matches=True, ignore_literals=rule.ignore_literals)
    return matcher.match(graph)


def apply_match(rule: Rule, graph: torch.fx.Graph, match: InternalMatch, pass_name: str) -> None:
    """Insert the replacement after the match's last input and reroute the pattern's outputs."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    inputs = match.placeholder_nodes
    last_input = max(inputs, key=order.__getitem__)
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    placeholders = [n for n in rule.replacement_graph.nodes if n.op == "placeholder"]
    env.update(zip(placeholders, inputs, strict=True))
    outputs: list[torch.fx.Node] = []
    anchor = last_input
    for node in rule.replacement_graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            returned = node.args[0] if isinstance(node.args[0], (tuple, list)) else [node.args[0]]
            outputs = [env[n] for n in returned]
            continue
        with graph.inserting_after(anchor):
            new = graph.node_copy(node, lambda n: env[n])
        new.meta = {}  # shapes were those of the example inputs; the pass manager refreshes them
        stamp(new, pass_name=pass_name, rule=rule.name)
        env[node] = new
        anchor = new
    for old, new in zip(match.returning_nodes, outputs, strict=True):
        old.replace_all_uses_with(new)
    for node in reversed(list(match.nodes_map.values())):
        if node.op == "call_function" and not node.users and node.graph is graph:
            graph.erase_node(node)


class RewritePass(Pass):
    """A pass made of by-example rules, applied in order, each to all its non-overlapping matches."""

    def __init__(self, name: str, why: str, contract: Contract, rules: list[Rule]) -> None:
        self.name, self.why, self.contract, self.rules = name, why, contract, rules

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        for rule in self.rules:
            for match in find_matches(rule, graph):
                anchor = match.returning_nodes[0] if match.returning_nodes else rule.name
                reason = rule.dtype_mismatch(match) or (rule.guard(match) if rule.guard else None)
                if reason is not None:
                    ctx.decline(rule.name, anchor, reason)
                elif ctx.fire(rule.name, anchor):
                    apply_match(rule, graph, match, self.name)
        graph.eliminate_dead_code()
