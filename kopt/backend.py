"""The dynamo backend: a :class:`KoptBackend` compiles each graph dynamo hands it with
:class:`~kopt.compiled_graph.CompiledGraph`, and keeps the report and options they share.

``torch.compile(model, backend="kopt")`` reaches :func:`kopt_backend` through the
``torch_dynamo_backends`` entry point, without importing kopt first. :func:`kopt.compile` builds a
:class:`KoptBackend` of its own (:func:`make_backend`) so that each compiled module has its own
report and options.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.exc import RestartAnalysis

from kopt.between_blocks import designed_break
from kopt.compiled_graph import CompiledGraph
from kopt.config import CompileOptions, Lowering, Role, WeightChange, WeightCheck, mode_options
from kopt.errors import CompileDuringCapture, LoweringCheckFailed, VerificationFailed, WeightsChangedError
from kopt.fp8.config import Fp8Config
from kopt.opaque_blocks import blocks_as_written
from kopt.passes.base import Fuel, Pass
from kopt.passes.pipeline import PassSpec, resolve
from kopt.progress import show_progress
from kopt.release import release_unread_weights
from kopt.report import GraphReport, Report
from kopt.weight_guard import WeightGuard

__all__ = ["KoptBackend", "LoweringCheckFailed", "VerificationFailed", "WeightsChangedError", "kopt_backend",
           "last_backend_report", "make_backend"]


def _graph_breaks() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return dict(counters.get("graph_break", {}))


def _enum(kind: type, value: Any, argument: str) -> Any:
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        choices = [member.value for member in kind]  # type: ignore[attr-defined]
        raise ValueError(f"{argument}={value!r}: expected one of {choices}") from None


def make_backend(passes: PassSpec = "auto", *, lower: Lowering | str = Lowering.INDUCTOR,
                 verify: bool = False, strict: bool = False,
                 roles: Mapping[str, Role | str] | None = None,
                 on_weight_change: WeightChange | str = WeightChange.RECOMPILE,
                 weight_check: WeightCheck | str = WeightCheck.CHECKSUM,
                 trace: str | Path | None = None, fuel: int | None = None,
                 memo_entries: int = 2, fp8: Fp8Config | bool | None = None,
                 cuda_graphs: bool | None = None, mode: str | None = None, progress: bool | None = None,
                 check_lowering: bool | None = None, kb: str | Path | bool | None = None,
                 share_weights: bool = True) -> KoptBackend:
    """A :class:`KoptBackend` from :func:`compile`'s keyword arguments (validated here)."""
    from kopt.agent.auto import uses_auto, with_knowledge_base

    auto = uses_auto(passes)
    if fp8:
        if fp8 is not True and not isinstance(fp8, Fp8Config):
            raise TypeError(f"fp8 must be a kopt.fp8.Fp8Config, True or None, got {type(fp8).__name__}")
        passes = resolve(passes, Fp8Config() if fp8 is True else fp8)
    passes = with_knowledge_base(passes, kb, auto=auto)  # "auto" + what the agent proved here (kopt.agent.auto)
    mode = mode or "default"
    mode_options(mode)  # an unknown mode fails here, not at the first call
    options = CompileOptions.from_environment(
        lower=_enum(Lowering, lower, "lower"),
        verify=verify,
        strict=strict,
        roles=tuple((name, _enum(Role, role, f"roles[{name!r}]")) for name, role in (roles or {}).items()),
        on_weight_change=_enum(WeightChange, on_weight_change, "on_weight_change"),
        weight_check=_enum(WeightCheck, weight_check, "weight_check"),
        trace_dir=Path(trace) if trace is not None else None,
        fuel=fuel,
        memo_entries=memo_entries,
        cuda_graphs=cuda_graphs,
        mode=mode,
        progress=progress,
        check_lowering=check_lowering,
        share_weights=share_weights,
    )
    return KoptBackend(passes, options)


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
        # regional (kopt.regional): why each graph's own CUDA graphs wait (the whole forward is recorded
        # instead), and how many signatures one graph may record (one per block when they do not wait)
        self.graphs_held_back: str | None = None
        self.max_graphs = 4
        # regional with release_weights: free each block's weights as soon as its derived ones exist
        # (False: not before the first call ends; True or device types: as release_unread_weights takes)
        self.release_early: bool | tuple[str, ...] = False
        # storages of weights that code outside the compiled graphs reads (regional: the code between
        # blocks, e.g. an embedding tied to a compiled LM head): never released
        self.read_outside: set[int] = set()
        self._breaks_before = _graph_breaks()
        self._block_passes: dict[tuple[str, ...], list[Pass]] = {}

    def fp8_config(self, *, chosen: bool = True) -> Fp8Config | None:
        """The FP8 config that selects linears block by block under regional compilation
        (:mod:`kopt.fp8.per_block`): the ``fp8-linear`` pass's; with ``chosen``, where the pipeline is
        chosen per graph (a pass that runs one of several, :meth:`kopt.passes.base.Pass.may_run`, as the
        knowledge base's and the agent's choices do), the one config among them that names blocks, if
        exactly one does (else None: each graph's own config selects by the paths in its graph, as before)."""
        from kopt.passes.fp8.linear import Fp8Linear

        direct = [p.config for p in self.passes if isinstance(p, Fp8Linear)]
        if direct or not chosen:
            return direct[0] if direct else None
        wrapped = {p.config for rewrite in self.passes for p in rewrite.may_run() if isinstance(p, Fp8Linear)}
        named = [config for config in wrapped if config.blocks is not None]
        return named[0] if len(named) == 1 else None

    def active_passes(self) -> list[Pass]:
        """The passes for the graph compiled now: :attr:`passes`, with the FP8 passes selecting a block
        group's linears while that group's blocks run (:mod:`kopt.fp8.per_block`)."""
        from kopt.fp8.per_block import current_selection

        selection = current_selection()
        if selection is None:
            return self.passes
        if selection not in self._block_passes:
            self._block_passes[selection] = [_selecting(rewrite, selection) for rewrite in self.passes]
        return self._block_passes[selection]

    def dispose(self) -> None:
        """Free every compiled graph: the module compiled with this backend is gone, but dynamo keeps
        each backend (and the graphs in its cache) alive until ``torch._dynamo.reset()``."""
        for graph in self.compiled:
            graph.dispose()
        self.compiled.clear()

    def read_storages(self) -> set[int]:
        """Storages of every weight some compiled graph reads (:meth:`CompiledGraph.read_storages`), and
        those the code that is not compiled reads (:attr:`read_outside`: never released)."""
        live: set[int] = set(self.read_outside)
        for graph in self.compiled:
            live |= graph.read_storages()
        return live

    def release_unread_weights(self, devices: Sequence[str] | None = None) -> int:
        """Free the storage of every captured weight no compiled graph reads (:mod:`kopt.release`), only on
        ``devices``' types when given."""
        live = self.read_storages()
        freed = release_unread_weights((t for g in self.compiled for t in g.release_candidates()), live, devices)
        for graph in self.compiled:
            graph.forget_released()
        self.report.released_bytes += freed
        return freed

    def weight_guards(self) -> list[WeightGuard]:
        """The guards of every compiled graph's weight sets (:mod:`kopt.forward_replay` reads them)."""
        return [guard for graph in self.compiled if graph.weights is not None for guard in graph.weights.guards()]

    def refresh(self) -> None:
        """Re-capture every compiled graph on its next call (after changing weights by hand)."""
        self.generation += 1

    def __call__(self, graph_module: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        from kopt.cuda_graphs import capturing

        if capturing():  # before any device work: the capture would record it (kopt.errors.CompileDuringCapture)
            raise CompileDuringCapture(  # its first 200 characters are what a failed recording reports
                "kopt does not compile a graph while a CUDA stream captures (its device work would be recorded, "
                "not run): call the module once with these inputs before capturing. Code that branches on "
                "capturing (transformers' mask helpers) passes compiled code inputs it never saw there.")
        graph_report = GraphReport(index=len(self.report.graphs), inputs=[])
        self.report.graphs.append(graph_report)
        now = _graph_breaks()
        self.report.graph_breaks = [f"{reason} (×{count - self._breaks_before.get(reason, 0)})"
                                    for reason, count in now.items()
                                    if count > self._breaks_before.get(reason, 0) and not designed_break(reason)]
        try:
            with show_progress(self.options.progress), blocks_as_written():
                compiled = CompiledGraph(self, graph_module, list(example_inputs), graph_report)
        except RestartAnalysis:  # dynamo traces the frame again and calls the backend with the new graph
            self.report.graphs.remove(graph_report)
            raise
        self.compiled.append(compiled)
        # a bound method, not the object: dynamo wraps what a backend returns with functools.wraps,
        # which copies the object's __dict__ (every graph and weight it holds) into the wrapper,
        # out of reach of dispose()
        return compiled.__call__


def _selecting(rewrite: Pass, selection: tuple[str, ...]) -> Pass:
    """``rewrite`` with every FP8 pass it may run selecting ``selection`` (:func:`kopt.fp8.per_block.block_config`)."""
    from kopt.fp8.per_block import block_config
    from kopt.passes.fp8.base import Fp8Pass

    def select(one: Pass) -> Pass:
        if not isinstance(one, Fp8Pass):
            return one
        chosen = copy.copy(one)
        chosen.config = block_config(one.config, selection)
        return chosen

    return rewrite.mapped(select)


_ENTRY_POINT_BACKENDS: dict[str, KoptBackend] = {}  # one per distinct options, so reports accumulate
_LAST_USED: list[KoptBackend] = []


def kopt_backend(graph_module: torch.fx.GraphModule, example_inputs: list[Any],
                 options: dict[str, Any] | None = None, mode: str | None = None) -> Callable[..., Any]:
    """``torch.compile(model, backend="kopt", options={...})``: the default pipeline, or ``options``
    with the keyword arguments of :func:`kopt.compile` (``passes``, ``lower``, ``verify``, ...).

    ``torch.compile`` forwards exactly two things to a registered backend, and only when they are
    not the defaults: ``mode`` (not ``"default"``) and ``options`` (not empty); it refuses both at
    once, so ``options={"mode": ...}`` combines a mode with kopt's options.
    """
    settings = dict(options or {})
    if mode is not None:
        settings["mode"] = mode
    key = repr(sorted(settings.items()))
    backend = _ENTRY_POINT_BACKENDS.get(key)
    if backend is None:
        try:
            backend = make_backend(**settings)
        except TypeError as error:  # an option kopt does not have: say which ones it has
            import inspect

            known = [name for name in inspect.signature(make_backend).parameters]
            raise TypeError(f"torch.compile(backend='kopt', options=...): {error}; kopt's options are "
                            f"{', '.join(known)}") from None
        from kopt.fp8.per_block import refuse_blocks_outside_regional

        refuse_blocks_outside_regional(backend.fp8_config(chosen=False))  # torch.compile traces the whole model
        _ENTRY_POINT_BACKENDS[key] = backend
    _LAST_USED[:] = [backend]
    return backend(graph_module, example_inputs)


def last_backend_report() -> Report | None:
    """The report of the ``backend="kopt"`` compilation that ran last in this process (None if none)."""
    return _LAST_USED[0].report if _LAST_USED else None
