"""``kopt.compile``: the main entry point."""

from __future__ import annotations

import inspect
import logging
import warnings
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from kopt.backend import KoptBackend, VerificationFailed, WeightsChangedError
from kopt.config import CompileOptions, Lowering, Role, WeightChange
from kopt.dynamo_cache import compile_isolated
from kopt.fallback import EagerFallbackWarning, note_eager_call, watching
from kopt.fp8.config import Fp8Config
from kopt.passes.manager import PassFailed
from kopt.passes.pipeline import PassSpec, resolve, with_fp8
from kopt.progress import show_progress
from kopt.release import WeightsReleasedError
from kopt.report import Report

log = logging.getLogger("kopt")  # progress at INFO (kopt.progress shows it)


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
                 trace: str | Path | None = None, fuel: int | None = None,
                 memo_entries: int = 2, fp8: Fp8Config | bool | None = None,
                 cuda_graphs: bool | None = None, progress: bool | None = None,
                 check_lowering: bool | None = None) -> KoptBackend:
    """A :class:`KoptBackend` from :func:`compile`'s keyword arguments (validated here)."""
    if fp8:
        if fp8 is not True and not isinstance(fp8, Fp8Config):
            raise TypeError(f"fp8 must be a kopt.fp8.Fp8Config, True or None, got {type(fp8).__name__}")
        from_auto = passes == "auto" or (isinstance(passes, (list, tuple)) and "auto" in passes)
        passes = with_fp8(resolve(passes), Fp8Config() if fp8 is True else fp8, from_auto=from_auto)
    options = CompileOptions.from_environment(
        lower=_enum(Lowering, lower, "lower"),
        verify=verify,
        strict=strict,
        roles=tuple((name, _enum(Role, role, f"roles[{name!r}]")) for name, role in (roles or {}).items()),
        on_weight_change=_enum(WeightChange, on_weight_change, "on_weight_change"),
        trace_dir=Path(trace) if trace is not None else None,
        fuel=fuel,
        memo_entries=memo_entries,
        cuda_graphs=cuda_graphs,
        progress=progress,
        check_lowering=check_lowering,
    )
    return KoptBackend(passes, options)


def _forward_argument_names(module: torch.nn.Module) -> tuple[str, ...]:
    try:
        parameters = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


class KoptModule(torch.nn.Module):
    """A compiled module: call it like the original; ``kopt_report`` says what kopt did.

    Attributes of the original module (``config``, ``dtype``, ...) are reachable through it, and
    its ``state_dict`` is the original's under the ``_orig_mod.`` prefix, as with ``torch.compile``.

    Each ``kopt.compile`` starts with dynamo cache state of its own (:mod:`kopt.dynamo_cache`), so
    compiling a module again (a notebook cell run twice) never inherits the recompile budget of
    earlier compilations; when the compiled module is garbage-collected its graphs and the weights
    derived from them are freed. A call that runs no kopt graph (dynamo's recompile limit) is
    counted in the report and raises an :class:`EagerFallbackWarning` (:mod:`kopt.fallback`).
    """

    def __init__(self, module: torch.nn.Module, backend: KoptBackend, *, fullgraph: bool,
                 dynamic: bool | None, release_weights: bool = False) -> None:
        super().__init__()
        self._orig_mod = module
        object.__setattr__(self, "_kopt_release_pending", release_weights)
        backend.argument_names = _forward_argument_names(module)
        object.__setattr__(self, "_kopt_backend", backend)
        object.__setattr__(self, "_kopt_compiled",
                           compile_isolated(module, backend, fullgraph=fullgraph, dynamic=dynamic))
        weakref.finalize(self, backend.dispose)  # dynamo keeps every backend alive: drop its graphs

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        backend = self._kopt_backend
        graph_calls, limit_before = backend.graph_calls, backend.report.recompile_limit
        try:
            with watching(backend.report):
                if backend.report.graphs:
                    out = self._kopt_compiled(*args, **kwargs)
                else:  # the first call compiles: dynamo's tracing, then kopt's steps (kopt.progress)
                    with show_progress(backend.options.progress):
                        log.info("tracing %s with dynamo", type(self._orig_mod).__name__)
                        out = self._kopt_compiled(*args, **kwargs)
        except torch._dynamo.exc.BackendCompilerFailed as error:
            inner = getattr(error, "inner_exception", None)
            if isinstance(inner, (PassFailed, VerificationFailed, WeightsChangedError, WeightsReleasedError)):
                raise inner from None  # kopt's own error, not a compiler crash: show it as such
            raise
        if backend.graph_calls == graph_calls:
            note_eager_call(backend.report, stacklevel=5)  # the caller of the module
        elif backend.report.recompile_limit != limit_before:
            warnings.warn(f"kopt: part of a call runs eagerly from now on when no compiled graph matches: "
                          f"{backend.report.recompile_limit}", EagerFallbackWarning, stacklevel=4)
        if self._kopt_release_pending:  # the first call compiled every graph of the forward: free what none reads
            object.__setattr__(self, "_kopt_release_pending", False)
            self._kopt_backend.release_unread_weights()
        return out

    @property
    def kopt_report(self) -> Report:
        """Per graph: inputs and their roles, each pass's matches, near misses, node changes, time."""
        return self._kopt_backend.report

    def kopt_refresh(self) -> None:
        """Re-capture with the module's current weights at the next call (after a LoRA swap)."""
        self._kopt_backend.refresh()

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)


def compile(model: torch.nn.Module, passes: PassSpec = "auto", *,
            lower: Lowering | str = Lowering.INDUCTOR, verify: bool = False, strict: bool = False,
            roles: Mapping[str, Role | str] | None = None,
            on_weight_change: WeightChange | str = WeightChange.RECOMPILE,
            trace: str | Path | None = None, fuel: int | None = None, memo_entries: int = 2,
            fullgraph: bool = False, dynamic: bool | None = None,
            fp8: Fp8Config | bool | None = None, cuda_graphs: bool | None = None,
            release_weights: bool = False, progress: bool | None = None,
            check_lowering: bool | None = None) -> KoptModule:
    """Compile ``model`` for inference with kopt's verified graph rewrites.

    Args:
        model: the module to speed up (inference only: weights are frozen into the graph).
        passes: ``"auto"`` (the default pipeline), a list mixing pass names and
            :class:`kopt.Pass` objects, or ``[]`` to capture and lower only.
        lower: ``"inductor"`` (default) or ``"eager"`` (run the rewritten graph op by op).
        verify: on the first call, run the rewritten graph op by op and check each output against
            the contracts of the passes that fired, measured against a higher-precision reference
            of the same weights with eager beside it (:mod:`kopt.verify`); fall back to the original
            graph if any contract is broken.
        strict: raise instead of skipping a pass that fails (or a failed verification).
        roles: binding time per forward argument (``{"timestep": "step-invariant"}``); arguments
            not named are inferred from their names, and the report says how.
        on_weight_change: what to do when frozen weights change after compiling:
            ``"recompile"`` (default), ``"raise"`` or ``"ignore"``.
        trace: folder for each pass's graph before/after (``KOPT_DEBUG=1`` uses ``kopt_debug``).
        fuel: apply only the first ``fuel`` rewrites (``KOPT_FUEL``), to bisect numerics.
        memo_entries: step-invariant results kept (one per distinct timestep/guidance value).
        fullgraph: passed to ``torch.compile``.
        dynamic: as ``torch.compile``'s. ``None`` (default): the first call compiles a graph for its
            shapes; a call whose sizes differ recompiles once into a graph with symbolic sizes that
            serves every later size (kopt rewrites both). ``True``: symbolic sizes from the first
            call. ``False``: one static graph per shape, up to dynamo's recompile limit (8); calls
            beyond it run eagerly, and the report and an :class:`EagerFallbackWarning` say so.
        fp8: a :class:`kopt.fp8.Fp8Config` (or ``True`` for the defaults): linears with constant
            weights become FP8 GEMMs, weights quantized once at compile time; ``verify=True``
            checks the result against the config's quality gate.
        cuda_graphs: replay each compiled graph from a CUDA graph (one launch per call instead of
            one per kernel; outputs are returned as fresh tensors). None (default): on for
            ``lower="inductor"`` when the inputs are CUDA tensors; ``False`` launches kernel by kernel.
        release_weights: after the first call, free the storage of the module's weights that no
            compiled graph reads (the bf16 originals of FP8-quantized or merged linears). The module
            can then no longer run by itself, and a call that needs a new compilation (new shapes,
            changed weights) raises :class:`kopt.WeightsReleasedError`.
        progress: show each step of a compile (tracing, capture, each pass, lowering, autotuning) on
            stderr: True, False, or None (default: a status line when stderr is a terminal and logging
            does not already show the ``kopt`` logger's INFO records).
        check_lowering: on the first call, check the lowered graph's outputs against a
            higher-precision reference of the same weights (fp64 on the CPU, fp32 on a GPU; one
            extra forward of that cost, once per compilation) and run the graph as FX if Inductor
            moved them further from it than the rule of :mod:`kopt.verify` allows (``strict``:
            raise :class:`kopt.LoweringCheckFailed`). None (default): on for ``lower="inductor"``.

    Returns:
        A :class:`KoptModule`; compilation happens at the first call.
    """
    backend = make_backend(passes, lower=lower, verify=verify, strict=strict, roles=roles,
                           on_weight_change=on_weight_change, trace=trace, fuel=fuel,
                           memo_entries=memo_entries, fp8=fp8, cuda_graphs=cuda_graphs, progress=progress,
                           check_lowering=check_lowering)
    return KoptModule(model, backend, fullgraph=fullgraph, dynamic=dynamic, release_weights=release_weights)
