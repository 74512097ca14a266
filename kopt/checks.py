"""The first call's numeric checks: each pass's contract (``verify=True``) and the lowering's.

Both compare against one higher-precision reference of the original graph on the first call's
inputs (:mod:`kopt.reference`), computed at most once per compilation and only if a check needs
it, with eager (the original graph run op by op in the model's precision) beside it. The rules are
in :mod:`kopt.verify`.

Why the lowering is checked at all: a pass's contract bounds what the rewrite does to the graph,
but Inductor then fuses, reorders and re-rounds that graph, and nothing checked it. It can drift
either way: on FLUX.1 it is 7x closer to fp32 than eager (it does not round ``guidance * 1000`` to
bf16), and a lowering bug would go unseen. So the lowered graph, like every pass, has a contract
(:class:`kopt.verify.LoweringRule`), checked on first use.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from kopt.fx.aliasing import uninitialized_outputs
from kopt.reference import ReferenceUnavailable, run_reference
from kopt.verify import LoweringRule, OutputCheck, compare

log = logging.getLogger("kopt")


class FirstCall:
    """A dynamo graph and the first call's inputs; its eager and reference outputs, computed lazily.

    ``constant_positions``: inputs that are weights (upcast op by op by the reference, so that it
    needs no upcast copy of the model); the others are upcast once up front.
    """

    def __init__(self, graph: torch.fx.GraphModule, inputs: list[Any], constant_positions: set[int]) -> None:
        self.graph, self.inputs, self.constant_positions = graph, inputs, constant_positions
        self._eager: Any = None
        self._reference: Any = None
        self._op_by_op: dict[int, Any] = {}
        self.unavailable: str | None = None  # why there is no reference
        self.reference_seconds = 0.0
        self.eager_seconds = 0.0
        self.undefined = uninitialized_outputs(graph)  # outputs whose values no check can judge

    @property
    def eager(self) -> Any:
        if self._eager is None:
            start = time.perf_counter()
            with torch.no_grad():
                self._eager = self.graph(*self.inputs)
            self.eager_seconds = time.perf_counter() - start
        return self._eager

    def op_by_op(self, graph_module: torch.fx.GraphModule, args: list[Any]) -> Any:
        """``graph_module(*args)`` run as FX (the rewritten graph before lowering), once per graph."""
        if id(graph_module) not in self._op_by_op:
            with torch.no_grad():
                self._op_by_op[id(graph_module)] = graph_module(*args)
        return self._op_by_op[id(graph_module)]

    @property
    def reference(self) -> Any:
        """The original graph's outputs in higher precision, or None (``unavailable`` says why)."""
        if self._reference is None and self.unavailable is None:
            start = time.perf_counter()
            user = {i for i in range(len(self.inputs)) if i not in self.constant_positions}
            try:
                self._reference = run_reference(self.graph, *self.inputs, upcast_inputs=user)
            except ReferenceUnavailable as reason:
                self.unavailable = str(reason)
            except Exception as error:  # noqa: BLE001 - an op without a higher-precision kernel, say
                self.unavailable = f"{type(error).__name__}: {error}"
            self.reference_seconds = time.perf_counter() - start
            log.info("reference forward in %.1f s%s", self.reference_seconds,
                     f" (unavailable: {self.unavailable})" if self.unavailable else "")
        return self._reference


@dataclasses.dataclass
class LoweringCheck:
    """What the lowering check found, for the report."""

    lowering: str
    outputs: list[dict[str, Any]]
    seconds: float  # the check's own cost: the reference forward (if it ran here), baseline and lowered calls
    ok: bool
    note: str = ""  # why it was not checked
    fallback: str | None = None  # what runs instead after a failure

    def describe(self) -> str:
        head = f"lowering check ({self.lowering} vs the higher-precision reference, {self.seconds:.2f} s)"
        if self.note:
            return f"{head}: {self.note}"
        return head + ": " + ("passed" if self.ok else f"FAILED, so {self.fallback or 'it raised'}")


def check_lowering(first: FirstCall, lowered: Callable[..., Any], args: list[Any],
                   op_by_op: Callable[[], Any], lowering: str, writes_in_place: str | None = None) -> LoweringCheck:
    """Run ``lowered(*args)`` once and judge it against the reference, with ``op_by_op()`` (the same
    graph run as FX) as the baseline, by :class:`~kopt.verify.LoweringRule`."""
    start = time.perf_counter()
    if writes_in_place:
        return LoweringCheck(lowering, [], 0.0, True, f"not checked: the graph writes in place at {writes_in_place}, "
                                                      "and the check would repeat the write")
    reference = first.reference
    if reference is None:
        return LoweringCheck(lowering, [], time.perf_counter() - start, True,
                             f"not checked: no higher-precision reference ({first.unavailable})")
    with torch.no_grad():
        baseline = op_by_op()
        candidate = lowered(*args)
    checks = compare(candidate, baseline, LoweringRule(), reference=reference, eager=first.eager,
                     undefined=first.undefined)
    seconds = time.perf_counter() - start
    return LoweringCheck(lowering, [as_record(c) for c in checks], seconds, all(c.ok for c in checks))


def as_record(check: OutputCheck) -> dict[str, Any]:
    """A report entry (``output``, ``verdict``, ``ok`` and every number of the check)."""
    return dataclasses.asdict(check)
