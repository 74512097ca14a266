"""The dynamo backend: capture → passes → (verify) → lower, once per dynamo graph.

``torch.compile(model, backend="kopt")`` reaches :func:`kopt_backend` through the
``torch_dynamo_backends`` entry point, without importing kopt first. :func:`kopt.compile` builds a
:class:`KoptBackend` of its own so that each compiled module has its own report and options.

Weights are frozen into the rewritten graph, so a compiled graph checks on every call that each
frozen tensor is still the same storage at the same version (``Tensor._version`` counts in-place
writes, which is how ``load_state_dict`` and LoRA fusing change weights) and then follows
``CompileOptions.on_weight_change``. When no rewrite fired, the original dynamo graph is lowered
exactly as plain ``torch.compile`` would, with weights as ordinary inputs and no check at all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo.exc import RestartAnalysis

from kopt.checks import FirstCall, as_record, check_lowering, writes_in_place
from kopt.config import CompileOptions, Lowering, Role, WeightChange
from kopt.cuda_graphs import CudaGraphRunner
from kopt.fx.capture import CapturedGraph, CaptureUnsupported, capture
from kopt.fx.precision_hazards import PrecisionHazard, find_precision_hazards
from kopt.fx.roles import InputRole, classify_inputs
from kopt.fx.staged_program import MemoStats, StagedProgram, split_stages
from kopt.fx.symbolic import concrete, dynamo_shape_env, guards_since, lowering_examples
from kopt.lower import lower
from kopt.passes.base import Contract, ContractKind, Fuel, Pass
from kopt.passes.manager import run_passes
from kopt.passes.pipeline import PassSpec, resolve
from kopt.passes.staging import HOIST_KEY
from kopt.progress import first_call_shows_progress, show_progress
from kopt.release import check_not_released, is_released, read_storages, release_unread_weights
from kopt.report import GraphReport, Report
from kopt.verify import compare

log = logging.getLogger("kopt")  # progress of long compiles at INFO (benchmarks/dit.py shows it)


class WeightsChangedError(RuntimeError):
    """Frozen weights changed after compiling and ``on_weight_change=WeightChange.RAISE``."""


class VerificationFailed(RuntimeError):
    """``verify=True`` and ``strict=True``, and the rewritten graph broke a pass's contract."""


class LoweringCheckFailed(VerificationFailed):
    """``strict=True``, and the lowered graph failed its numeric check (:mod:`kopt.checks`)."""


def _graph_breaks() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return dict(counters.get("graph_break", {}))


class CompiledGraph:
    """One dynamo graph, compiled; callable with dynamo's argument list."""

    def __init__(self, backend: KoptBackend, dynamo_graph: torch.fx.GraphModule,
                 example_inputs: list[Any], report: GraphReport) -> None:
        self.backend, self.dynamo_graph, self.report = backend, dynamo_graph, report
        self._build(example_inputs, in_dynamo=True)

    def _build(self, example_inputs: list[Any], *, in_dynamo: bool = False) -> None:
        options = self.backend.options
        placeholders = [n for n in self.dynamo_graph.graph.nodes if n.op == "placeholder"]
        roles = classify_inputs(placeholders, example_inputs, dict(options.roles),
                                self.backend.argument_names)
        check_not_released(example_inputs, [r.argument or r.source for r in roles])
        self.constant_inputs = [example_inputs[r.index] for r in roles if r.role is Role.CONSTANT]
        self.report.inputs = [dict(argument=r.argument or r.source, role=r.role.value, reason=r.reason)
                              for r in roles]
        self.report.passes, self.report.verification, self.report.fallback = [], [], None
        self.report.lowering_check, self.report.hazards = None, []
        self.report.memo = None
        self.report.cuda_graphs = None
        self.captured: CapturedGraph | None = None
        self._signature: list[tuple[int, int, int]] = []
        start = time.perf_counter()
        log.info("graph %d: capturing %d nodes", self.report.index, len(self.dynamo_graph.graph.nodes))
        shape_env = None if in_dynamo else dynamo_shape_env(self.dynamo_graph)
        guards = len(shape_env.guards) if shape_env is not None else 0
        rewritten = self._capture_and_rewrite(example_inputs, roles, in_dynamo)
        self.report.capture_seconds = time.perf_counter() - start
        start = time.perf_counter()
        self.report.lowering = options.lower.value
        log.info("graph %d: captured and rewritten in %.1f s; lowering with %s", self.report.index,
                 self.report.capture_seconds, options.lower.value)
        first = FirstCall(self.dynamo_graph, [concrete(value) for value in example_inputs],  # sizes as on this call
                          {r.index for r in roles if r.role is Role.CONSTANT})
        if rewritten is not None and self._verified(first, rewritten):
            try:
                self.runner = self._lower_rewritten(rewritten, rewritten.user_args(example_inputs))
                self.captured = rewritten
                self._signature = [(i, t._version, t.data_ptr()) for i, t in rewritten.constants]
            except RestartAnalysis:  # dynamo retraces the frame (it specializes a float Inductor met)
                raise
            except Exception as error:  # lowering the rewritten graph failed: lower the original
                if options.strict:
                    raise
                self.report.fallback = f"lowering the rewritten graph failed: {type(error).__name__}: {error}"
        if self.captured is not None and guards_since(shape_env, guards):
            # captured again after dynamo compiled the frame (a weight change): a size guard added now
            # would never be checked, so the graph could run at sizes it is wrong for
            self.captured, self._signature = None, []
            self.report.fallback = ("capturing again after a weight change needed new size guards "
                                    f"({'; '.join(guards_since(shape_env, guards)[:3])}): running the original graph")
        if self.captured is None:
            # captured again with symbolic sizes: Inductor outside dynamo would compile for this call's sizes
            original = self.dynamo_graph.forward if options.lower is Lowering.EAGER or shape_env else None
            self.runner = original or lower(self.dynamo_graph, example_inputs, options.lower)
            if not self.report.fallback:
                self.report.lowering += " (original graph: no rewrite fired)"
        if options.checks_lowering:
            self._check_lowering(first)
        self.report.compile_seconds = time.perf_counter() - start
        log.info("graph %d: lowered in %.1f s", self.report.index, self.report.compile_seconds)
        self.runner = first_call_shows_progress(self.runner, options.progress)  # kernels autotune on it
        self.generation = self.backend.generation

    def _lower_rewritten(self, rewritten: CapturedGraph, user_args: list[Any],
                         lowering: Lowering | None = None) -> Callable[..., Any]:
        """Lower the rewritten graph; in two memoized stages if the staging pass marked a frontier."""
        options, graph_module = self.backend.options, rewritten.graph_module
        lowering = lowering or options.lower
        frontier = graph_module.meta.get(HOIST_KEY)
        if not frontier:
            return self._replayed(lower(graph_module, lowering_examples(graph_module, user_args), lowering),
                                  user_args)
        try:
            split = split_stages(graph_module, frontier)
        except KeyError as reason:  # a pass after staging removed a frontier value: run unstaged
            self.report.passes[-1].notes.append(f"step-invariant stage not split out: {reason}")
            return self._replayed(lower(graph_module, lowering_examples(graph_module, user_args), lowering),
                                  user_args)
        keys = [user_args[i] for i in split.key_positions]
        with torch.no_grad():
            hoisted = list(split.invariant(*[concrete(k) for k in keys]))
        log.info("graph %d: lowering the step-invariant stage", self.report.index)
        invariant = lower(split.invariant, lowering_examples(split.invariant, keys), lowering)
        log.info("graph %d: lowering the per-call stage", self.report.index)
        main_examples = lowering_examples(split.main, user_args + hoisted)
        main = self._replayed(lower(split.main, main_examples, lowering), user_args + hoisted)
        self.report.memo = MemoStats()
        return StagedProgram(invariant, main, split.key_positions, options.memo_entries, self.report.memo)

    def _replayed(self, lowered: Callable[..., Any], inputs: list[Any]) -> Callable[..., Any]:
        """``lowered`` behind a :class:`CudaGraphRunner` when the options ask for it and the inputs
        are on a GPU (the per-step stage only: the step-invariant one runs once per timestep)."""
        on_gpu = any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)
        if not (self.backend.options.use_cuda_graphs and on_gpu):
            return lowered
        runner = CudaGraphRunner(lowered)
        self.report.cuda_graphs = runner.stats
        return runner

    def _capture_and_rewrite(self, example_inputs: list[Any], roles: list[InputRole],
                             in_dynamo: bool) -> CapturedGraph | None:
        options = self.backend.options
        try:
            captured = capture(self.dynamo_graph, example_inputs, roles, in_dynamo=in_dynamo)
        except CaptureUnsupported as reason:
            self.report.fallback = f"capture unsupported: {reason}"
            return None
        except RestartAnalysis:  # capture asked dynamo to retrace with the module's floats specialized
            raise
        except Exception as error:  # a capture bug must not break the user's model either
            if options.strict:
                raise
            self.report.fallback = f"capture failed: {type(error).__name__}: {error}"
            return None
        self.report.hazards = self._hazards(captured, example_inputs)
        self.report.passes = run_passes(captured.graph_module, self.backend.passes,
                                        graph_index=self.report.index, strict=options.strict,
                                        fuel=self.backend.fuel, trace_dir=options.trace_dir)
        fired = any(record.total_matches for record in self.report.passes)
        return captured if fired else None

    def _hazards(self, captured: CapturedGraph, example_inputs: list[Any]) -> list[PrecisionHazard]:
        """Precision hazards of the captured graph, before any pass (an analysis never breaks a model)."""
        try:
            return find_precision_hazards(captured.graph_module, captured.user_args(example_inputs))
        except Exception as error:  # noqa: BLE001
            if self.backend.options.strict:
                raise
            log.warning("graph %d: precision hazard analysis failed: %s: %s", self.report.index,
                        type(error).__name__, error)
            return []

    def _verified(self, first: FirstCall, rewritten: CapturedGraph) -> bool:
        """Each output of the rewritten graph (run as FX) within the contracts of the passes that fired,
        judged against the higher-precision reference with eager beside it (:mod:`kopt.verify`)."""
        options = self.backend.options
        if not options.verify:
            return True
        contract = Contract.exact()
        for record, rewrite in zip(self.report.passes, self.backend.passes, strict=True):
            if record.total_matches:
                contract = contract.combine(rewrite.contract)
        # a bit-identity check needs no reference; computed anyway when the lowering check needs it
        needs_reference = contract.kind is not ContractKind.EXACT or options.checks_lowering
        reference = first.reference if needs_reference else None
        candidate = first.op_by_op(rewritten.graph_module, rewritten.user_args(first.inputs))
        checks = compare(candidate, first.eager, contract, reference=reference)
        self.report.verification = [as_record(c) for c in checks]
        self.report.reference_unavailable = first.unavailable
        failed = [c for c in checks if not c.ok]
        if not failed:
            return True
        self.report.fallback = (f"verification failed against contract {contract.describe()}: "
                                + "; ".join(f"output {c.output}: {c.verdict}" for c in failed))
        if options.strict:
            raise VerificationFailed(self.report.fallback)
        return False

    def _check_lowering(self, first: FirstCall) -> None:
        """The lowered graph against the reference on the first call's inputs (:mod:`kopt.checks`);
        on a failure, run the same graph as FX (``strict``: raise :class:`LoweringCheckFailed`).

        Why FX and not the original graph lowered: the check failed in the lowering, not in the
        passes (``verify=True`` judges those separately), so the rewritten graph run op by op keeps
        kopt's rewrites and its memo, and lowering the original graph would trust the same lowering.
        """
        options = self.backend.options
        writes = writes_in_place(self.dynamo_graph)
        captured = self.captured
        if captured is not None:
            args = captured.user_args(first.inputs)
            check = check_lowering(first, self.runner, args,
                                   lambda: first.op_by_op(captured.graph_module, args), options.lower.value,
                                   writes_in_place=writes)
        else:
            check = check_lowering(first, self.runner, first.inputs, lambda: first.eager, options.lower.value,
                                   writes_in_place=writes)
        self.report.lowering_check = check
        self.report.reference_unavailable = first.unavailable
        if check.ok:
            return
        reason = f"the graph lowered by {options.lower.value} failed its numeric check: " + "; ".join(
            f"output {c['output']}: {c['verdict']}" for c in check.outputs if not c["ok"])
        if options.strict:
            raise LoweringCheckFailed(reason)
        if captured is not None:
            self.runner = self._lower_rewritten(captured, captured.user_args(first.inputs), Lowering.EAGER)
            check.fallback = "the rewritten graph runs as FX (op by op)"
        else:
            self.runner = self.dynamo_graph.forward
            check.fallback = "the original graph runs op by op"
        self.report.lowering = f"eager (fallback: {options.lower.value} failed the lowering check)"
        log.warning("graph %d: %s; %s", self.report.index, reason, check.fallback)

    def read_storages(self) -> set[int]:
        """Storages of the weights this graph reads: its rewritten graph's constants, or all of its
        constant inputs when it runs the original graph."""
        if self.captured is not None:
            return read_storages(self.captured.graph_module)
        return {t.untyped_storage().data_ptr() for t in self.constant_inputs
                if isinstance(t, torch.Tensor) and t.device.type != "meta"}

    def forget_released(self) -> None:
        """Stop checking released weights for changes (they are no longer read, and have no bytes)."""
        self._signature = [(i, version, pointer) for i, version, pointer in self._signature
                           if self.captured is None or not is_released(dict(self.captured.constants)[i])]

    def _weights_changed(self, args: Sequence[Any]) -> bool:
        for index, version, pointer in self._signature:
            tensor = args[index]
            if tensor._version != version or tensor.data_ptr() != pointer:
                return True
        return False

    def dispose(self) -> None:
        """Drop the compiled graph and everything it holds (frozen and derived weights)."""
        self.runner, self.captured, self.constant_inputs, self._signature = _discarded, None, [], []
        self.dynamo_graph = None  # type: ignore[assignment]

    def __call__(self, *args: Any) -> Any:
        self.backend.graph_calls += 1  # kopt.fallback: a call of the module that ran no graph ran eagerly
        stale = self.generation != self.backend.generation
        if stale or (self._signature and self._weights_changed(args)):
            policy = self.backend.options.on_weight_change
            if policy is WeightChange.RAISE and not stale:
                raise WeightsChangedError(
                    "weights frozen into the kopt graph changed after compiling; call "
                    "module.kopt_refresh() or compile with on_weight_change=WeightChange.RECOMPILE")
            if policy is not WeightChange.IGNORE or stale:
                self.report.weight_refreshes += 1
                with show_progress(self.backend.options.progress):
                    self._build(list(args))
        if self.captured is not None:
            return self.runner(*self.captured.user_args(args))
        return self.runner(*args)


def _discarded(*args: Any) -> Any:
    raise RuntimeError("kopt: this graph belongs to a kopt.compile'd module that was garbage-collected")


class KoptBackend:
    """A dynamo backend with its own passes, options and report."""

    def __init__(self, passes: PassSpec = "auto", options: CompileOptions | None = None) -> None:
        self.passes: list[Pass] = resolve(passes)  # resolved now: a typo fails at compile(), not later
        self.options = options or CompileOptions.from_environment()
        self.fuel = Fuel(self.options.fuel)
        self.report = Report()
        self.generation = 0
        self.argument_names: tuple[str, ...] = ()  # the forward signature, to name positional inputs
        self.compiled: list[CompiledGraph] = []
        self.graph_calls = 0  # compiled graphs run so far (kopt.fallback)
        self._breaks_before = _graph_breaks()

    def dispose(self) -> None:
        """Free every compiled graph: the module compiled with this backend is gone, but dynamo keeps
        each backend (and the graphs in its cache) alive until ``torch._dynamo.reset()``."""
        for graph in self.compiled:
            graph.dispose()
        self.compiled.clear()

    def release_unread_weights(self) -> int:
        """Free the storage of every captured weight no compiled graph reads (:mod:`kopt.release`)."""
        live: set[int] = set()
        for graph in self.compiled:
            live |= graph.read_storages()
        freed = release_unread_weights((t for g in self.compiled for t in g.constant_inputs), live)
        for graph in self.compiled:
            graph.forget_released()
        self.report.released_bytes += freed
        return freed

    def refresh(self) -> None:
        """Re-capture every compiled graph on its next call (after changing weights by hand)."""
        self.generation += 1

    def __call__(self, graph_module: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graph_report = GraphReport(index=len(self.report.graphs), inputs=[])
        self.report.graphs.append(graph_report)
        now = _graph_breaks()
        self.report.graph_breaks = [f"{reason} (×{count - self._breaks_before.get(reason, 0)})"
                                    for reason, count in now.items()
                                    if count > self._breaks_before.get(reason, 0)]
        try:
            with show_progress(self.options.progress):
                compiled = CompiledGraph(self, graph_module, list(example_inputs), graph_report)
        except RestartAnalysis:  # dynamo traces the frame again and calls the backend with the new graph
            self.report.graphs.remove(graph_report)
            raise
        self.compiled.append(compiled)
        # a bound method, not the object: dynamo wraps what a backend returns with functools.wraps,
        # which copies the object's __dict__ (every graph and weight it holds) into the wrapper,
        # out of reach of dispose()
        return compiled.__call__


_ENTRY_POINT_BACKENDS: dict[str, KoptBackend] = {}  # one per distinct options, so reports accumulate
_LAST_USED: list[KoptBackend] = []


def kopt_backend(graph_module: torch.fx.GraphModule, example_inputs: list[Any],
                 options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """``torch.compile(model, backend="kopt", options={...})``: the default pipeline, or ``options``
    with the keyword arguments of :func:`kopt.compile` (``passes``, ``lower``, ``verify``, ...)."""
    key = repr(sorted((options or {}).items()))
    backend = _ENTRY_POINT_BACKENDS.get(key)
    if backend is None:
        from kopt.api import make_backend

        backend = _ENTRY_POINT_BACKENDS[key] = make_backend(**(options or {}))
    _LAST_USED[:] = [backend]
    return backend(graph_module, example_inputs)


def last_backend_report() -> Report | None:
    """The report of the ``backend="kopt"`` compilation that ran last in this process (None if none)."""
    return _LAST_USED[0].report if _LAST_USED else None
