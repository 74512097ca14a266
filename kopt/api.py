"""``kopt.compile``: the main entry point."""

from __future__ import annotations

import functools
import inspect
import logging
import warnings
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from kopt.backend import KoptBackend, make_backend
from kopt.config import Lowering, Role, WeightChange, WeightCheck
from kopt.dynamo_cache import compile_isolated
from kopt.errors import kopt_errors_unwrapped
from kopt.fallback import EagerFallbackWarning, note_eager_call, watching
from kopt.fp8.config import Fp8Config
from kopt.passes.pipeline import PassSpec
from kopt.progress import show_progress
from kopt.regional import KoptRegional, compile_regional
from kopt.release import Release, resolve_release
from kopt.report import Report

log = logging.getLogger("kopt")  # progress at INFO (kopt.progress shows it)


def _argument_names(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The names of ``fn``'s positional parameters (dynamo names positional inputs by index)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def _run(backend: KoptBackend, compiled: Callable[..., Any], name: str, args: tuple[Any, ...],
         kwargs: dict[str, Any]) -> Any:
    """One call of a compiled module or function: progress on the compiling call, kopt's own errors
    unwrapped, and a call that ran no kopt graph counted and warned about (:mod:`kopt.fallback`)."""
    graph_calls, limit_before = backend.graph_calls, backend.report.recompile_limit
    with kopt_errors_unwrapped(), watching(backend.report):
        if backend.report.graphs:
            out = compiled(*args, **kwargs)
        else:  # the first call compiles: dynamo's tracing, then kopt's steps (kopt.progress)
            with show_progress(backend.options.progress):
                log.info("tracing %s with dynamo", name)
                out = compiled(*args, **kwargs)
    if backend.graph_calls == graph_calls:
        note_eager_call(backend.report, stacklevel=6)  # the caller of the module
    elif backend.report.recompile_limit != limit_before:
        warnings.warn(f"kopt: part of a call runs eagerly from now on when no compiled graph matches: "
                      f"{backend.report.recompile_limit}", EagerFallbackWarning, stacklevel=5)
    return out


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
                 dynamic: bool | None, release_weights: Release = False) -> None:
        super().__init__()
        self._orig_mod = module
        object.__setattr__(self, "_kopt_release_pending", release_weights)
        backend.argument_names = _argument_names(module.forward)
        object.__setattr__(self, "_kopt_backend", backend)
        object.__setattr__(self, "_kopt_compiled",
                           compile_isolated(module, backend, fullgraph=fullgraph, dynamic=dynamic))
        weakref.finalize(self, backend.dispose)  # dynamo keeps every backend alive: drop its graphs

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = _run(self._kopt_backend, self._kopt_compiled, type(self._orig_mod).__name__, args, kwargs)
        release = self._kopt_release_pending
        if release:  # the first call compiled every graph of the forward: free what none reads
            object.__setattr__(self, "_kopt_release_pending", False)
            self._kopt_backend.release_unread_weights(None if release is True else release)
        return out

    @property
    def kopt_report(self) -> Report:
        """Per graph: inputs and their roles, each pass's matches, near misses, node changes, time."""
        return self._kopt_backend.report

    def kopt_refresh(self) -> None:
        """Capture and lower again with the module's current weights at the next call (changes kopt
        watches are handled without it; see ``on_weight_change`` and ``weight_check``)."""
        self._kopt_backend.refresh()

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)


class KoptFunction:
    """A compiled function: call it like the original; ``kopt_report`` says what kopt did.

    Tensors the function reads from its closure or from globals are inputs of the compiled graph,
    read on every call (as with ``torch.compile``), so changing them needs no recompilation.
    """

    def __init__(self, fn: Callable[..., Any], backend: KoptBackend, *, fullgraph: bool,
                 dynamic: bool | None) -> None:
        functools.update_wrapper(self, fn)
        backend.argument_names = _argument_names(fn)
        self._kopt_backend = backend
        self._kopt_compiled = torch.compile(fn, backend=backend, fullgraph=fullgraph, dynamic=dynamic)
        weakref.finalize(self, backend.dispose)  # dynamo keeps every backend alive: drop its graphs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _run(self._kopt_backend, self._kopt_compiled, getattr(self, "__name__", "function"), args, kwargs)

    @property
    def kopt_report(self) -> Report:
        """Per graph: inputs and their roles, each pass's matches, near misses, node changes, time."""
        return self._kopt_backend.report

    def kopt_refresh(self) -> None:
        """Capture and lower again at the next call."""
        self._kopt_backend.refresh()


def compile(model: torch.nn.Module | Callable[..., Any], passes: PassSpec = "auto", *,
            lower: Lowering | str = Lowering.INDUCTOR, verify: bool = False, strict: bool = False,
            roles: Mapping[str, Role | str] | None = None,
            on_weight_change: WeightChange | str = WeightChange.RECOMPILE,
            weight_check: WeightCheck | str = WeightCheck.CHECKSUM,
            trace: str | Path | None = None, fuel: int | None = None, memo_entries: int = 2,
            fullgraph: bool = False, dynamic: bool | None = None,
            fp8: Fp8Config | bool | None = None, cuda_graphs: bool | None = None,
            release_weights: bool | None = None, mode: str | None = None, progress: bool | None = None,
            check_lowering: bool | None = None, kb: str | Path | bool | None = None,
            regional: bool = False, share_weights: bool = True,
            between_blocks: str = "eager") -> KoptModule | KoptFunction | KoptRegional:
    """Compile ``model`` for inference with kopt's verified graph rewrites.

    Args:
        model: the module to speed up (inference only), or a plain function (then a
            :class:`KoptFunction` comes back).
        passes: ``"auto"`` (the default pipeline), a list mixing pass names and
            :class:`kopt.Pass` objects, or ``[]`` to capture and lower only.
        lower: ``"inductor"`` (default) or ``"eager"`` (run the rewritten graph op by op).
        verify: on the first call, compare the rewritten graph against the original on the same
            inputs and fall back to the original if any pass's contract is broken.
        strict: raise instead of skipping a pass that fails (or a failed verification).
        roles: binding time per forward argument (``{"timestep": "step-invariant"}``); arguments
            not named are inferred from their names, and the report says how.
        on_weight_change: what to do when a weight behind a derived constant (merged, quantized,
            folded, memoized) changes after compiling: ``"recompile"`` (default: derive them again
            in place, without capturing or lowering again), ``"raise"`` or ``"ignore"``. Weights no
            pass transformed are read live by the compiled graph and need nothing.
        weight_check: how such a change is noticed: ``"checksum"`` (default: also sees writes
            through ``param.data``, as PEFT's LoRA hot-swap makes; reads those weights once per
            call) or ``"version"`` (version counter and storage only: free, misses ``.data`` writes).
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
        release_weights: free the storage of the module's weights that no compiled graph reads (the
            bf16 originals of FP8-quantized linears; merged ones are shared, see ``share_weights``):
            after the first call, and with ``regional=True`` each block's as soon as its FP8 copies
            exist. None (default): only with ``fp8`` and ``regional=True``, and only weights on a GPU:
            the quantized weights then replace the bf16 ones (the module is handed over, as a
            quantization library would take it), so that peak memory stays at or below eager bf16's;
            new shapes still compile, from the FP8 weights already made. ``True``: also whole-model
            (a call needing a new compilation, new shapes included, may then raise
            :class:`kopt.WeightsReleasedError`, naming the fix) and on every device; ``False`` keeps
            both. After a release the module can no longer run by itself, changed weights or
            ``kopt_refresh()`` raise, and a freed weight keeps its shape but holds no bytes: writing
            into it (``param.data.copy_``, fusing a LoRA adapter) or moving the module (``.to()``)
            reads or writes out of bounds, a crash on the CPU and a CUDA error on a GPU.
        mode: ``torch.compile``'s modes: ``"default"``, ``"reduce-overhead"`` (CUDA graphs on),
            ``"max-autotune"`` (Inductor's GEMM and launch-config tuning, CUDA graphs on),
            ``"max-autotune-no-cudagraphs"`` (the same, CUDA graphs off); an explicit
            ``cuda_graphs`` wins over the mode's.
        progress: show each step of a compile (tracing, capture, each pass, lowering, autotuning) on
            stderr: True, False, or None (default: a status line when stderr is a terminal and logging
            does not already show the ``kopt`` logger's INFO records).
        check_lowering: on the first call, check the lowered graph's outputs against a
            higher-precision reference of the same weights (fp64 on the CPU, fp32 on a GPU; one
            extra forward of that cost, once per compilation) and run the graph as FX if Inductor
            moved them further from it than the rule of :mod:`kopt.verify` allows (``strict``:
            raise :class:`kopt.LoweringCheckFailed`). None (default): on for ``lower="inductor"``.
        kb: the agent's knowledge base (``kopt optimize``): with ``passes`` including ``"auto"``, the
            candidates it accepted for this model's regions in this environment are applied, each
            verified again on first use (:mod:`kopt.agent.auto`). None (default): ``$KOPT_KB`` or
            ``~/.cache/kopt/kb.sqlite`` if the file exists; a path; False: never.
        regional: compile one instance of each repeated block (diffusers' ``_repeated_blocks``, else
            the items of the outermost ``nn.ModuleList``) and reuse its code, with each block's own
            weights, for the others (:mod:`kopt.regional`): compile time of a few blocks instead of
            the model, but no rewrite that spans blocks (block seams, the float32 residual stream,
            the step-invariant stage) and the code between blocks runs eagerly. Returns a
            :class:`kopt.regional.KoptRegional`.
        between_blocks: with ``regional=True``, what becomes of the code between the blocks:
            ``"eager"`` (default) runs it as written; ``"linears"`` also compiles each linear there
            with at least 1024 input and output features on its own (an LLM's LM head), so that FP8
            and the knowledge base's choices reach it (:func:`kopt.regional.linears_between_blocks`);
            ``"outer"`` compiles the model's code around the module that runs the blocks (an LLM's LM
            head with its logit soft cap, as one graph; :mod:`kopt.between_blocks`; a model whose own
            forward runs its blocks is refused); ``"compiled"`` compiles all of the model's own code,
            each block call one ``kopt::opaque_block`` op in its graph (:mod:`kopt.opaque_blocks`:
            FLUX.1's guidance scaled without eager's rounding, every DiT's embeddings and output layers
            fused). With either, weights outside the blocks are never released.
        share_weights: the module's weights that a merged constant holds row for row (Q/K/V and
            other sibling projections) become views of it, so their bytes are held once
            (:mod:`kopt.fx.shared_weights`) and writes to them need no per-call checksum. They
            change address, and one block's merged weights share one storage (safetensors and
            ``torch.save`` handle that); ``False`` keeps the module's weights as they are, at the
            cost of a second copy of them.

    Returns:
        A :class:`KoptModule` (a :class:`KoptFunction` for a function); compilation happens at
        the first call.
    """
    if not callable(model):
        raise TypeError(f"kopt.compile expects a torch.nn.Module or a function, got {type(model).__name__}")
    backend = make_backend(passes, lower=lower, verify=verify, strict=strict, roles=roles,
                           on_weight_change=on_weight_change, weight_check=weight_check, trace=trace, fuel=fuel,
                           memo_entries=memo_entries, fp8=fp8, cuda_graphs=cuda_graphs, mode=mode,
                           progress=progress, check_lowering=check_lowering, kb=kb, share_weights=share_weights)
    release = resolve_release(release_weights, fp8, regional)
    if not regional:
        from kopt.fp8.per_block import refuse_blocks_outside_regional

        # the user's own config; a knowledge-base choice for a block graph never applies to a whole model
        refuse_blocks_outside_regional(backend.fp8_config(chosen=False))
    if between_blocks != "eager" and not regional:
        raise ValueError(f"between_blocks={between_blocks!r} is for regional=True (a whole-model compilation "
                         "compiles the code between blocks already)")
    if regional:
        return compile_regional(model, backend, fullgraph=fullgraph, dynamic=dynamic,  # type: ignore[arg-type]
                                release_weights=release, between_blocks=between_blocks)
    if not isinstance(model, torch.nn.Module):
        if release_weights:
            raise ValueError("release_weights=True frees a module's weights; a function has none")
        return KoptFunction(model, backend, fullgraph=fullgraph, dynamic=dynamic)
    return KoptModule(model, backend, fullgraph=fullgraph, dynamic=dynamic, release_weights=release)
