"""Compiling one captured dynamo graph: capture → passes → (verify) → lower; the one compile path
that :func:`kopt.compile` and ``torch.compile(backend="kopt")`` both reach through
:class:`kopt.backend.KoptBackend`.

Weights are frozen while the passes run; afterwards (:mod:`kopt.fx.weights`) the weights no pass
transformed become inputs of the lowered graph again, read live on every call as with
``torch.compile``, and the constants the passes derived from weights (merged, quantized, folded,
and the memoized step-invariant stage) are passed as tensors kopt owns. A
:class:`~kopt.weight_guard.WeightGuard` watches only the weights those derived values came from;
on a change the graph follows ``CompileOptions.on_weight_change`` (by default it derives them again
in place, with no new capture or lowering). A graph called with several modules' weights (repeated
blocks compiled regionally) keeps derived tensors per module (:mod:`kopt.weight_sets`). When no
rewrite fired, the original dynamo graph is lowered exactly as plain ``torch.compile`` would, with
weights as ordinary inputs and no check. On its first call, each graph's passes (``verify=True``) and
its lowering are judged against a higher-precision reference of the same weights (:mod:`kopt.checks`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch._dynamo.exc import RestartAnalysis

import kopt.lowering_memory as lowering_memory
from kopt.checks import FirstCall, LoweringCheck, as_record, check_lowering
from kopt.config import Lowering, Role, WeightChange
from kopt.cuda_graphs import CudaGraphRunner, CudaGraphStats
from kopt.errors import LoweringCheckFailed, VerificationFailed, WeightsChangedError
from kopt.fx.aliasing import writes_in_place
from kopt.fx.capture import CapturedGraph, CaptureUnsupported, capture
from kopt.fx.float32_stage import Float32Stage, computed_in_float32
from kopt.fx.fusion_work import fusion_work, nothing_to_fuse
from kopt.fx.precision_hazards import PrecisionHazard, find_precision_hazards
from kopt.fx.roles import InputRole, classify_inputs
from kopt.fx.staged_program import BothStages, MemoStats, StagedProgram, StageSplit, split_stages
from kopt.fx.symbolic import concrete, dynamo_shape_env, guards_since, lowering_examples
from kopt.fx.weights import WeightBinding, bind_weights
from kopt.kernel_warmup import warm_up_kernels
from kopt.lower import INDUCTOR_PATCHES_KEY, lower
from kopt.opaque_blocks import CALLS_BLOCKS, holds_opaque_blocks
from kopt.passes.base import Contract, ContractKind
from kopt.passes.graph.staging import HOIST_COST_KEY, HOIST_KEY
from kopt.passes.manager import run_passes
from kopt.progress import first_call_shows_progress, show_progress
from kopt.release import (
    WeightsReleasedError,
    check_not_released,
    is_released,
    read_storages,
    release_unread_weights,
    stand_ins,
)
from kopt.report import GraphReport
from kopt.verify import compare
from kopt.weight_sets import WeightSets

if TYPE_CHECKING:
    from kopt.backend import KoptBackend

log = logging.getLogger("kopt")  # progress of long compiles at INFO (benchmarks/dit/dit.py shows it)


_ON_CHANGE = {WeightChange.RECOMPILE: "derive them again in place", WeightChange.RAISE: "raise",
              WeightChange.IGNORE: "nothing"}

class CompiledGraph:
    """One dynamo graph, compiled; callable with dynamo's argument list."""

    def __init__(self, backend: KoptBackend, dynamo_graph: torch.fx.GraphModule,
                 example_inputs: list[Any], report: GraphReport) -> None:
        self.backend, self.dynamo_graph, self.report = backend, dynamo_graph, report
        # fixed now: a block group's FP8 selection is in effect only while its blocks compile
        # (kopt.fp8.per_block), and a later re-capture must rewrite the graph the same way
        self.passes = backend.active_passes()
        self._build(example_inputs, in_dynamo=True)

    def _build(self, example_inputs: list[Any], *, in_dynamo: bool = False) -> None:
        options = self.backend.options
        placeholders = [n for n in self.dynamo_graph.graph.nodes if n.op == "placeholder"]
        roles = classify_inputs(placeholders, example_inputs, dict(options.roles),
                                self.backend.argument_names)
        real_inputs, self._stood_in = example_inputs, False
        if in_dynamo and any(is_released(t) for t in example_inputs) and self._siblings():
            # after a release, dynamo compiles again (new shapes): stand-ins go through the passes, and
            # the derived weights come from the earlier graphs that made them
            example_inputs, self._stood_in = stand_ins(example_inputs), True
        else:
            check_not_released(example_inputs, [r.argument or r.source for r in roles])
        self.constant_inputs = [real_inputs[r.index] for r in roles if r.role is Role.CONSTANT]
        self.report.inputs = [dict(argument=r.argument or r.source, role=r.role.value, reason=r.reason)
                              for r in roles]
        self.report.passes, self.report.verification, self.report.fallback = [], [], None
        self.report.lowering_check, self.report.hazards = None, []
        self.report.memo = None
        self.report.cuda_graphs = None
        self.captured: CapturedGraph | None = None
        self.binding: WeightBinding | None = None
        self.weights: WeightSets | None = None
        self.staged: StagedProgram | None = None
        self.report.weights = {}
        self._shared_bytes = 0
        self._lowered_stages = 0  # stages handed to a lowering (not run as FX), for _check_lowering
        start = time.perf_counter()
        log.info("graph %d: capturing %d nodes", self.report.index, len(self.dynamo_graph.graph.nodes))
        shape_env = None if in_dynamo else dynamo_shape_env(self.dynamo_graph)
        guards = len(shape_env.guards) if shape_env is not None else 0
        rewritten = self._capture_and_rewrite(example_inputs, roles, in_dynamo)
        self.report.capture_seconds = time.perf_counter() - start
        start = time.perf_counter()
        self.report.lowering = options.lower.value
        if options.lower is Lowering.INDUCTOR and options.inductor_options:
            self.report.lowering += f" ({', '.join(f'{k}={v}' for k, v in options.inductor_options.items())})"
        log.info("graph %d: captured and rewritten in %.1f s; lowering with %s", self.report.index,
                 self.report.capture_seconds, options.lower.value)
        first = FirstCall(self.dynamo_graph, [concrete(value) for value in example_inputs],  # sizes as on this call
                          {r.index for r in roles if r.role is Role.CONSTANT})
        if rewritten is not None:  # its kernels compiled side by side before its first run (just below)
            warm_up_kernels(rewritten.graph_module, _device_of(first.inputs), self.report.index)
        if rewritten is not None and self._verified(first, rewritten):
            binding = None
            try:
                binding = self._bind_weights(rewritten, example_inputs)
                if options.share_weights:  # before lowering: Inductor sees the weights where they will be
                    self._shared_bytes = binding.share_storage(example_inputs)
                self.runner = self._lower_rewritten(rewritten, binding, example_inputs)
                self.captured, self.binding = rewritten, binding
                self._watch_weights(real_inputs)
            except (RestartAnalysis, WeightsReleasedError):  # dynamo retraces the frame; or nothing can run
                raise
            except Exception as error:  # lowering the rewritten graph failed: lower the original
                if binding is not None and self._shared_bytes:  # the original reads the weights as traced
                    binding.unshare_storage(example_inputs)
                    self._shared_bytes = 0
                if options.strict:
                    raise
                self.report.fallback = f"lowering the rewritten graph failed: {type(error).__name__}: {error}"
        if self.captured is not None and guards_since(shape_env, guards):
            # captured again after dynamo compiled the frame (a weight change): a size guard added now
            # would never be checked, so the graph could run at sizes it is wrong for
            self.captured, self.binding, self.weights = None, None, None
            self.report.fallback = ("capturing again after a weight change needed new size guards "
                                    f"({'; '.join(guards_since(shape_env, guards)[:3])}): running the original graph")
        if self.captured is None and self._stood_in:  # the original graph would read the freed weights
            raise WeightsReleasedError(
                "compiling again (new shapes) after release_weights freed weights (on by default with regional "
                f"fp8), and no rewritten graph could run ({self.report.fallback or 'no rewrite fired'}); compile with "
                "release_weights=False to keep them")
        if self.captured is None:
            # captured again with symbolic sizes: Inductor outside dynamo would compile for this call's sizes
            original = self.dynamo_graph.forward if options.lower is Lowering.EAGER or shape_env else None
            self.runner = original or lower(self.dynamo_graph, example_inputs, options.lower,
                                            options.inductor_options)
            if not self.report.fallback:
                self.report.lowering += " (original graph: no rewrite fired)"
        if options.checks_lowering:
            self._check_lowering(first)
        self.report.compile_seconds = time.perf_counter() - start
        log.info("graph %d: lowered in %.1f s", self.report.index, self.report.compile_seconds)
        self.runner = first_call_shows_progress(self.runner, options.progress)  # kernels autotune on it
        self.generation = self.backend.generation

    def _bind_weights(self, rewritten: CapturedGraph, example_inputs: list[Any]) -> WeightBinding:
        """Weights become inputs again: module weights read live, derived ones kopt's (kopt.fx.weights)."""
        graph_module = rewritten.graph_module
        return bind_weights(graph_module, example_inputs, rewritten.user_indices,
                            [i for i, _ in rewritten.constants], [r.source for r in rewritten.roles],
                            self._traced, graph_module.meta.get(HOIST_KEY) or ())

    def _siblings(self) -> list[WeightSets]:
        """The weight sets of the backend's other compiled graphs (regional: other graphs of a block class)."""
        return [g.weights for g in self.backend.compiled if g.weights is not None and g is not self]

    def _watch_weights(self, example_inputs: list[Any]) -> None:
        binding, options = self.binding, self.backend.options
        assert binding is not None
        self._live_weights = [example_inputs[p] for p in binding.live_positions]
        if self._stood_in:
            self._borrow_derived(example_inputs)
        check = None if options.on_weight_change is WeightChange.IGNORE else options.weight_check
        if binding.sources:
            self.weights = WeightSets(binding, example_inputs, check, share=options.share_weights,
                                      siblings=self._siblings)
        guard = self.weights.guard if self.weights is not None else None
        self.report.weights = dict(
            live=len(binding.live_positions), derived=len(binding.derived), watched=len(binding.sources),
            check="none" if guard is None else options.weight_check.value,
            watched_bytes=0 if guard is None else guard.watched_bytes,
            shared_bytes=self._shared_bytes,
            on_change="rebuild" if binding.rebuild_on_change else _ON_CHANGE[options.on_weight_change], sets=1)
        if self._stood_in:
            self.report.weights["derived_from"] = "earlier graphs (compiled on stand-ins for released weights)"

    def _borrow_derived(self, example_inputs: list[Any]) -> None:
        """A graph compiled on stand-ins for released weights: its derived weights are the ones another
        graph made from the same weights by the same recipes (:meth:`WeightSets.derived_by_recipe`),
        or it cannot run: a weight it reads live was released, or no graph made what it derives."""
        binding = self.binding
        assert binding is not None and self.captured is not None
        names = [p for p in binding.live_positions if is_released(example_inputs[p])]
        if names:
            raise WeightsReleasedError(
                f"compiling again (new shapes) needs weights read live that release_weights freed (the default "
                f"with fp8; inputs {names[:4]}); compile with release_weights=False to keep them")
        wanted = [binding.recipe(name, example_inputs) for name, _ in binding.derived]
        found = next((f for f in (s.derived_by_recipe(wanted) for s in self._siblings()) if f is not None), None)
        if found is None:
            raise WeightsReleasedError(
                "compiling again (new shapes) derives weights no earlier graph made from these weights, and "
                "release_weights freed their sources (on by default with regional fp8); compile with "
                "release_weights=False")
        for name, _ in binding.derived:  # the stand-ins' derived values: not read, not kept
            if hasattr(self.captured.graph_module, name):
                delattr(self.captured.graph_module, name)
        binding.derived = [(name, tensor) for (name, _), tensor in zip(binding.derived, found, strict=True)]

    def _lower_rewritten(self, rewritten: CapturedGraph, binding: WeightBinding, example_inputs: list[Any],
                         lowering: Lowering | None = None) -> Callable[..., Any]:
        """Lower the rewritten graph; in two memoized stages if the staging pass marked a frontier.
        Lowered without autograd: kopt's graphs are for inference, and weights are now inputs."""
        self._lowered_stages = 0
        self._graph_patches = dict(rewritten.graph_module.meta.get(INDUCTOR_PATCHES_KEY) or {})
        if self._graph_patches:
            patched = ", ".join(f"{k}={v}" for k, v in self._graph_patches.items())
            self.report.lowering += f" (for this graph: {patched})"
        with torch.no_grad():
            return self._lower_stages(rewritten.graph_module, binding.inputs(example_inputs), binding,
                                      lowering or self.backend.options.lower)

    def _lower_stages(self, graph_module: torch.fx.GraphModule, user_args: list[Any],
                      binding: WeightBinding, lowering: Lowering) -> Callable[..., Any]:
        options = self.backend.options
        frontier = graph_module.meta.get(HOIST_KEY)
        static = binding.weight_inputs

        def unstaged() -> Callable[..., Any]:
            whole = self._per_call_lowering(graph_module, lowering, staged=False)
            return self._replayed(self._lower(graph_module, user_args, whole), user_args, static)

        if not frontier:
            return unstaged()
        try:
            split = split_stages(graph_module, frontier)
        except KeyError as reason:  # a pass after staging removed a frontier value: run unstaged
            self.report.passes[-1].notes.append(f"step-invariant stage not split out: {reason}")
            return unstaged()
        keys = [user_args[i] for i in split.key_positions]
        hoisted = list(split.invariant(*[concrete(k) for k in keys]))
        invariant = self._lower_invariant(split.invariant, keys, hoisted, self._invariant_cost(graph_module, split,
                                                                                              user_args), lowering)
        lowered_main = self._lower(split.main, user_args + hoisted, self._per_call_lowering(split.main, lowering))
        main = self._replayed(lowered_main, user_args + hoisted, static)
        # the memo's bypass runs both stages as one program: one recording, no launches in between
        both = self._replayed(BothStages(invariant, lowered_main, split.key_positions), user_args, static,
                              share_with=main)
        self.report.memo = MemoStats()
        self.staged = StagedProgram(invariant, main, split.key_positions, options.memo_entries, self.report.memo,
                                    weight_positions=split.weight_positions, both=both)
        return self.staged

    def _per_call_lowering(self, main: torch.fx.GraphModule, lowering: Lowering, staged: bool = True) -> Lowering:
        """How the per-call stage (``staged``; else the whole graph) is lowered: as the rest, but one that
        calls blocks through ``kopt::opaque_block`` and leaves Inductor nothing to fuse runs as FX
        (:mod:`kopt.fx.fusion_work`), unless a precision hazard is in it (Inductor's fusion is what
        removes one)."""
        why = ""
        if lowering is Lowering.INDUCTOR and holds_opaque_blocks(main):
            work = fusion_work(main)
            names = {node.name for node in main.graph.nodes}
            hazards = [h.node for h in self.report.hazards if h.node in names]
            if nothing_to_fuse(work) and not hazards:
                note = (f"per-call stage run as FX, not lowered: besides its block calls, GEMMs and kopt's kernels, "
                        f"{work.describe()}: nothing for Inductor to fuse")
                self.report.lowering += f" ({note})"
                log.info("graph %d: %s", self.report.index, note)
                return Lowering.EAGER
            why = f" (precision hazards at {', '.join(hazards)})" if hazards else f" ({work.describe()} to fuse)"
        if staged or why:
            log.info("graph %d: lowering the %s%s", self.report.index, "per-call stage" if staged else "graph", why)
        return lowering

    @staticmethod
    def _invariant_cost(graph_module: torch.fx.GraphModule, split: StageSplit,
                        user_args: list[Any]) -> tuple[float, int] | None:
        """(GEMM FLOPs, bytes of weights) of the step-invariant stage: the constants the staging pass
        counted and the weights it reads as inputs."""
        cost = graph_module.meta.get(HOIST_COST_KEY)
        if cost is None:
            return None
        flops, constant_bytes = cost
        weights = [user_args[i] for i in split.weight_positions]
        return flops, constant_bytes + sum(w.numel() * w.element_size() for w in weights if isinstance(w, torch.Tensor))

    def _lower_invariant(self, invariant: torch.fx.GraphModule, keys: list[Any], hoisted: list[Any],
                         cost: tuple[float, int] | None, lowering: Lowering) -> Callable[..., Any]:
        """The step-invariant stage: lowered as the rest, or where Inductor would lower a small one,
        computed op by op in float32 (:mod:`kopt.fx.float32_stage`)."""
        if lowering is Lowering.INDUCTOR and cost is not None and computed_in_float32(*cost):
            flops, constant_bytes = cost
            stage = Float32Stage(invariant, like=hoisted)
            what = (f"step-invariant stage ({flops / 1e6:,.1f} MFLOP of GEMMs, {constant_bytes / 2**20:,.1f} MiB of "
                    "constants)")
            try:  # once on this call's values: an op that cannot run so is found here
                stage(*[concrete(k) for k in keys])
            except Exception as error:  # noqa: BLE001 - lowered as any other stage instead
                note = (f"{what} lowered: computing it op by op in float32 failed "
                        f"({type(error).__name__}: {str(error).splitlines()[0][:160]})")
            else:
                note = f"{what} computed op by op in float32, not lowered"
                self.report.passes[-1].notes.append(note)
                log.info("graph %d: %s", self.report.index, note)
                return stage
            self.report.passes[-1].notes.append(note)
        log.info("graph %d: lowering the step-invariant stage", self.report.index)
        return self._lower(invariant, keys, lowering)

    def _lower(self, graph_module: torch.fx.GraphModule, inputs: list[Any], lowering: Lowering) -> Callable[..., Any]:
        """``graph_module`` lowered; symbolic graphs with fakes of their symbols (one kernel set for every size)."""
        patches = {**self.backend.options.inductor_options, **getattr(self, "_graph_patches", {})}
        if lowering is not Lowering.EAGER:
            self._lowered_stages += 1
        return lower(graph_module, lowering_examples(graph_module, inputs), lowering, patches)

    def _replayed(self, lowered: Callable[..., Any], inputs: list[Any], static: Sequence[int],
                  share_with: Callable[..., Any] | None = None) -> Callable[..., Any]:
        """``lowered`` behind a :class:`CudaGraphRunner` when the options ask for it and the inputs
        are on a GPU (the per-step stage only: the step-invariant one runs once per timestep);
        ``static``: the weights among ``inputs``, replayed from their own storage; ``share_with``:
        a runner of the same graph whose counters and memory pool this one shares."""
        on_gpu = any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)
        if not (self.backend.options.use_cuda_graphs and on_gpu):
            return lowered
        if holds_opaque_blocks(self.dynamo_graph):  # the blocks' own graphs record, never inside this one's
            self.report.cuda_graphs = CudaGraphStats(disabled=CALLS_BLOCKS)
            return lowered
        limit = self.backend.max_graphs
        if isinstance(share_with, CudaGraphRunner):
            return CudaGraphRunner(lowered, static_inputs=static, stats=share_with.stats, pool=share_with.pool,
                                   max_graphs=limit)
        runner = CudaGraphRunner(lowered, static_inputs=static, pool=torch.cuda.graph_pool_handle(), max_graphs=limit)
        runner.stats.disabled = self.backend.graphs_held_back  # regional: until the whole forward fails to record
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
            # a failure kopt did not expect: in the log too, where a run's progress is read
            log.warning("graph %d: %s; lowering the graph as dynamo traced it", self.report.index,
                        self.report.fallback)
            return None
        self._traced = {str(n.target) for n in captured.graph_module.graph.nodes if n.op == "get_attr"}
        self.report.hazards = self._hazards(captured, example_inputs)
        self.report.passes = run_passes(captured.graph_module, self.passes,
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
        for record, rewrite in zip(self.report.passes, self.passes, strict=True):
            if record.total_matches:
                contract = contract.combine(rewrite.contract)
        # a bit-identity check needs no reference; computed anyway when the lowering check needs it
        needs_reference = contract.kind is not ContractKind.EXACT or options.checks_lowering
        reference = first.reference if needs_reference else None
        candidate = first.op_by_op(rewritten.graph_module, rewritten.user_args(first.inputs))
        checks = compare(candidate, first.eager, contract, reference=reference, undefined=first.undefined)
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
        captured, binding = self.captured, self.binding
        rewritten = captured is not None and binding is not None
        if rewritten and not self._lowered_stages:
            # the per-call stage runs as FX, as verified, the step-invariant one (if any) in float32 under the
            # reference's own machinery: nothing a lowering could have changed is left to check
            self.report.lowering_check = LoweringCheck(
                options.lower.value, [], 0.0, True,
                "nothing in this graph was lowered: it runs as FX, as verified (a small step-invariant stage "
                "computed in float32 by the reference's machinery)")
            return
        args = binding.inputs(first.inputs) if rewritten else first.inputs  # rewritten: weights are inputs now
        parts = lowering_memory.key_parts((captured.graph_module if rewritten else self.dynamo_graph).code, args,
                                          options.lower.value,
                                          lowering_memory.lowering_settings(options.mode, options.inductor_options))
        key = lowering_memory.key_of(parts)
        before = lowering_memory.remembered(key)
        if before is not None:  # the same code passed before (kopt.lowering_memory): nothing new to check
            self.report.lowering_check = LoweringCheck(
                options.lower.value, [], 0.0, True,
                f"passed before for this graph, layout, device and versions "
                f"({time.strftime('%Y-%m-%d %H:%M', time.localtime(before['passed_at']))}; "
                f"{lowering_memory.RECHECK_ENV}=1 checks again)")
            return
        changed = None if lowering_memory.rechecking() else lowering_memory.why_not_remembered(parts)
        if changed:
            log.info("graph %d: checking the lowering again: a check of this graph text passed before, with another %s",
                     self.report.index, changed)
        if rewritten:
            check = check_lowering(first, lambda *a: self._run(first.inputs), args,
                                   lambda: first.op_by_op(captured.graph_module, args), options.lower.value,
                                   writes_in_place=writes)
        else:
            check = check_lowering(first, self.runner, first.inputs, lambda: first.eager, options.lower.value,
                                   writes_in_place=writes)
        self.report.lowering_check = check
        self.report.reference_unavailable = first.unavailable
        if check.ok and check.outputs:  # judged and passed (not skipped with a note)
            lowering_memory.remember(key, check.seconds, len(check.outputs), parts)
        if check.ok:
            return
        reason = f"the graph lowered by {options.lower.value} failed its numeric check: " + "; ".join(
            f"output {c['output']}: {c['verdict']}" for c in check.outputs if not c["ok"])
        if options.strict:
            raise LoweringCheckFailed(reason)
        if captured is not None and binding is not None:
            self.runner = self._lower_rewritten(captured, binding, first.inputs, Lowering.EAGER)
            check.fallback = "the rewritten graph runs as FX (op by op)"
        else:
            self.runner = self.dynamo_graph.forward
            check.fallback = "the original graph runs op by op"
        self.report.lowering = f"eager (fallback: {options.lower.value} failed the lowering check)"
        log.warning("graph %d: %s; %s", self.report.index, reason, check.fallback)

    def read_storages(self) -> set[int]:
        """Storages of the weights this graph reads: its rewritten graph's constants, the module
        weights it reads live and its derived tensors (module weights shared with them live there),
        or all of its constant inputs when it runs the original graph."""
        if self.captured is not None and self.binding is not None:
            live = {t.untyped_storage().data_ptr() for t in self._live_weights if t.device.type != "meta"}
            derived = self.weights.derived_storages() if self.weights is not None else set()
            return read_storages(self.captured.graph_module) | live | derived
        return {t.untyped_storage().data_ptr() for t in self.constant_inputs
                if isinstance(t, torch.Tensor) and t.device.type != "meta"}

    def release_candidates(self) -> list[Any]:
        """The module weights this graph was compiled from, and under regional compilation every other
        block's weights behind its derived values (:meth:`kopt.weight_sets.WeightSets.source_weights`);
        :func:`kopt.release.release_unread_weights` frees those no graph reads."""
        others = []
        if self.weights is not None and self.binding is not None:
            others = self.weights.source_weights(self.binding.live_positions)
        return [*self.constant_inputs, *others]

    def _release_new_sets(self) -> None:
        """Regional with ``release_weights``: free the weights behind the derived values of the sets made
        since the last call, now that those values exist, unless some graph reads them. Valid for the
        same reason as the release after the first call (:mod:`kopt.release`), earlier: a block's weights
        are read once, to derive its set, so a FP8 model's first call peaks near the bf16 model's size
        instead of holding every bf16 and FP8 weight at once."""
        assert self.weights is not None and self.binding is not None
        keys, candidates = self.weights.take_new_sources(self.binding.live_positions)
        if not candidates:
            return
        release = self.backend.release_early
        freed = release_unread_weights(candidates, self.backend.read_storages(),
                                       None if release is True else release)  # type: ignore[arg-type]
        if freed:
            self.backend.report.released_bytes += freed
            self.weights.forget_released(keys)

    def forget_released(self) -> None:
        """Stop checking released weights for changes (they are no longer read, and have no bytes)."""
        if self.weights is not None:
            self.weights.forget_released()
            guard = self.weights.guard
            self.report.weights["watched_bytes"] = 0 if guard is None else guard.watched_bytes

    def _weights_changed(self, args: Sequence[Any], changed: list[int]) -> None:
        """A weight behind a derived value changed: derive again in place (or raise, or rebuild)."""
        assert self.binding is not None and self.weights is not None and self.weights.guard is not None
        if self.backend.options.on_weight_change is WeightChange.RAISE:
            raise WeightsChangedError(
                "weights that kopt derived constants from changed after compiling; call "
                "module.kopt_refresh() or compile with on_weight_change=WeightChange.RECOMPILE")
        if self.binding.rebuild_on_change:
            self.report.weight_refreshes += 1
            with show_progress(self.backend.options.progress):
                self._build(list(args))
            return
        try:
            self.binding.rederive(args, changed)
        except WeightsReleasedError:
            raise
        except Exception as error:  # e.g. a weight changed shape behind dynamo's back: start over
            log.warning("graph %d: re-deriving constants failed (%s); rebuilding", self.report.index, error)
            self.report.weight_refreshes += 1
            with show_progress(self.backend.options.progress):
                self._build(list(args))
            return
        if self.staged is not None:
            self.staged.clear()
        self.weights.guard.snapshot(args, self.binding.aliased(args))  # a weight given new storage: no longer a view
        self.report.weight_rederivations += 1

    def dispose(self) -> None:
        """Drop the compiled graph and everything it holds (frozen and derived weights)."""
        self.runner, self.captured, self.binding, self.weights, self.staged = _discarded, None, None, None, None
        self.constant_inputs = []
        self.dynamo_graph = None  # type: ignore[assignment]

    def __call__(self, *args: Any) -> Any:
        self.backend.graph_calls += 1  # kopt.fallback: a call of the module that ran no graph ran eagerly
        if self.generation != self.backend.generation:  # kopt_refresh(): capture and lower again
            self.report.weight_refreshes += 1
            with show_progress(self.backend.options.progress):
                self._build(list(args))
        if self.weights is None:
            return self._run(args)
        if self.weights.select(args):  # another module's weights (a repeated block): its derived tensors
            self.report.weights["sets"] = self.weights.count
            if self.staged is not None:
                self.staged.clear()
        if self.backend.release_early:
            self._release_new_sets()
        guard = self.weights.guard
        if guard is None:
            return self._run(args)
        checks = guard.start(args)
        if all(check.ready for check in checks):  # versions, storages, CPU checksums: known before running
            changed = [p for check in checks for p in check.changed()]
            if changed:
                self._weights_changed(args, changed)
            return self._run(args)
        out = self._run(args)  # runs beside the GPU checksum; discarded if a weight turns out changed
        changed = [p for check in checks for p in check.changed()]
        if not changed:
            return out
        self._weights_changed(args, changed)
        return self._run(args)

    def _run(self, args: Sequence[Any]) -> Any:
        if self.binding is None:
            return self.runner(*args)
        with torch.no_grad():
            return self.runner(*self.binding.inputs(args))


def _discarded(*args: Any) -> Any:
    raise RuntimeError("kopt: this graph belongs to a kopt.compile'd module that was garbage-collected")


def _device_of(inputs: Sequence[Any]) -> torch.device:
    """Where a graph runs: the device of its first GPU tensor input, else the CPU."""
    return next((t.device for t in inputs if isinstance(t, torch.Tensor) and t.is_cuda), torch.device("cpu"))
