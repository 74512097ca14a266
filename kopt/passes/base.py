"""What a pass is: a named graph rewrite with a reason it is valid and a numeric contract.

A pass mutates an ATen ``GraphModule`` in place and reports through a :class:`PassContext`: each
rewrite it applies (``ctx.fire``, which also spends optimization fuel) and each place it looked at
and declined, with the reason (``ctx.decline``; these near misses feed ``kopt explain``).
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar, TypeVar

import torch


class ContractKind(enum.Enum):
    EXACT = "exact"  # bit-identical outputs
    TOLERANCE = "tolerance"  # bounded relative error, stated
    QUALITY = "quality"  # lossy (e.g. FP8), gated by a quality metric


@dataclasses.dataclass(frozen=True)
class Contract:
    """The numeric promise a pass makes; ``verify=True`` checks outputs against it."""

    kind: ContractKind
    rel_tol: float = 0.0
    min_cosine: float = 1.0

    @staticmethod
    def exact() -> Contract:
        return Contract(ContractKind.EXACT)

    @staticmethod
    def tolerance(rel_tol: float) -> Contract:
        """Relative error ``||out - ref|| / ||ref||`` at most ``rel_tol`` (per output, in the output dtype)."""
        return Contract(ContractKind.TOLERANCE, rel_tol=rel_tol)

    @staticmethod
    def quality(min_cosine: float, rel_tol: float) -> Contract:
        return Contract(ContractKind.QUALITY, rel_tol=rel_tol, min_cosine=min_cosine)

    def describe(self) -> str:
        if self.kind is ContractKind.EXACT:
            return "exact"
        if self.kind is ContractKind.TOLERANCE:
            return f"tolerance (rel ≤ {self.rel_tol:g})"
        return f"quality (cos ≥ {self.min_cosine:g}, rel ≤ {self.rel_tol:g})"

    def combine(self, other: Contract) -> Contract:
        """The contract of applying both: the looser kind, added error bounds, lower cosine floor."""
        kind = max(self.kind, other.kind, key=lambda k: list(ContractKind).index(k))
        return Contract(kind, rel_tol=self.rel_tol + other.rel_tol,
                        min_cosine=min(self.min_cosine, other.min_cosine))


@dataclasses.dataclass(frozen=True)
class NearMiss:
    """A place a rule looked at and declined, and why."""

    rule: str
    node: str
    reason: str


class OutOfFuel(Exception):
    """Raised by :meth:`Fuel.spend` when the rewrite budget is used up."""


@dataclasses.dataclass
class Fuel:
    """A shared budget of rewrites (``KOPT_FUEL=N``); ``None`` means unlimited."""

    remaining: int | None = None

    def spend(self) -> None:
        if self.remaining is None:
            return
        if self.remaining <= 0:
            raise OutOfFuel
        self.remaining -= 1


@dataclasses.dataclass
class PassContext:
    """What a running pass reports into: rewrites applied, near misses, free-form notes; and where it
    may write debug artifacts (``trace_dir``, set by ``KOPT_DEBUG`` or ``trace=``; None: nowhere)."""

    pass_name: str
    fuel: Fuel = dataclasses.field(default_factory=Fuel)
    matches: dict[str, int] = dataclasses.field(default_factory=dict)
    near_misses: list[NearMiss] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    trace_dir: Path | None = None

    def fire(self, rule: str, node: torch.fx.Node | str) -> bool:
        """Ask to apply ``rule`` at ``node``; False (and a near miss) once fuel runs out."""
        try:
            self.fuel.spend()
        except OutOfFuel:
            self.decline(rule, node, "out of optimization fuel (KOPT_FUEL)")
            return False
        self.matches[rule] = self.matches.get(rule, 0) + 1
        return True

    def decline(self, rule: str, node: torch.fx.Node | str, reason: str) -> None:
        self.near_misses.append(NearMiss(rule, getattr(node, "name", str(node)), reason))

    @property
    def total_matches(self) -> int:
        return sum(self.matches.values())


Found = TypeVar("Found")


def accepted_matches(graph: torch.fx.Graph, target: object, match: Callable[[torch.fx.Node], Found | str | None],
                     ctx: PassContext, rule: str,
                     rule_of: Callable[[Found], str] | None = None) -> Iterator[tuple[torch.fx.Node, Found]]:
    """Each node calling ``target`` whose ``match`` succeeds and for which fuel remains.

    ``match`` returns what the rewrite needs, a string (the reason to decline, recorded as a near
    miss under ``rule``), or None (not a candidate at all: nothing recorded). ``rule_of`` names the
    rule a successful match fires under, for passes with several rules (default: ``rule``).
    Iterates over a snapshot, so the caller may rewrite the graph as it goes."""
    for node in list(graph.nodes):
        if node.target is not target or getattr(node, "_erased", False):  # erased by an earlier rewrite
            continue
        found = match(node)
        if found is None:
            continue
        if isinstance(found, str):
            ctx.decline(rule, node, found)
        elif ctx.fire(rule_of(found) if rule_of else rule, node):
            yield node, found


class Pass(abc.ABC):
    """A graph rewrite. Subclasses set ``name``, ``why`` and ``contract`` and implement ``apply``.

    ``runs_before``: where the pass goes when it is added to a pipeline that lacks it (the agent's
    choice "add <pass>", :func:`kopt.passes.pipeline.with_pass`): right before the pass of that
    name. ``staging`` by default, which marks the values it hoists by node name and so runs last."""

    name: str
    why: str
    contract: Contract
    runs_before: ClassVar[str] = "staging"

    @abc.abstractmethod
    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        """Rewrite ``graph_module`` in place, reporting every rewrite and near miss into ``ctx``."""

    def may_run(self) -> list[Pass]:
        """The passes this one runs in a graph: itself; a pass that picks one of several per graph (the
        knowledge base's per-graph choices) names each of them."""
        return [self]

    def mapped(self, change: Callable[[Pass], Pass]) -> Pass:
        """This pass with ``change`` applied to each pass it may run (:meth:`may_run`): ``change(self)``
        here; a pass that picks per graph returns a copy holding the changed ones."""
        return change(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}: {self.contract.describe()}>"


class FunctionPass(Pass):
    """A pass from a plain function ``fn(graph_module, ctx)``, for user passes that need no class."""

    def __init__(self, name: str, why: str, contract: Contract,
                 fn: Callable[[torch.fx.GraphModule, PassContext], None]) -> None:
        self.name, self.why, self.contract, self._fn = name, why, contract, fn

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        self._fn(graph_module, ctx)
