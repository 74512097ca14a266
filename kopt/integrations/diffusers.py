"""``kopt.optimize_pipeline(pipe)``: a diffusers pipeline whose transformer runs through kopt.

    pipe = kopt.optimize_pipeline(FluxPipeline.from_pretrained(...), fp8=True)
    image = pipe(prompt, num_inference_steps=28).images[0]
    print(pipe.kopt.memo)        # step-invariant memo: hits, misses
    pipe.kopt.restore()          # the pipeline as it was

The transformer is compiled *in place*, as ``pipe.transformer.compile()`` and diffusers'
``compile_repeated_blocks`` do (the module's call goes through a compiled version of itself), so
``pipe.transformer`` stays the very same object: its class, config, hooks, ``cache_context``,
``save_pretrained`` and the pipeline's registered components are untouched. The whole forward is
one kopt compilation (not regional): the step-invariant stage spans the timestep embedding and
every block's modulation, which only a whole-forward graph sees.

What the stock pipelines pass per step (diffusers 0.36-0.42, ``FluxPipeline`` and
``QwenImagePipeline``): a new ``timestep / 1000`` tensor for each call, equal in value for the two
halves of a CFG pair; the same ``guidance`` tensor and position ids every step. kopt's memo keys on
input values, so both halves share one evaluation of the step-invariant stage when they run the
same graph. FLUX's text is padded to ``max_sequence_length`` by its tokenizer, so both halves have
one shape; Qwen-Image encodes prompt and negative prompt separately, with different lengths, so
kopt pads the text to a shared bucket with the transformer's own text mask
(:mod:`kopt.integrations.text_padding`) and both halves run one graph.

VAE and text encoders run once per image and are left alone unless named in ``components``
(``"vae.decode"``: the method pipelines call; ``"text_encoder"``: the module's call).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Sequence
from typing import Any

import torch

from kopt.backend import KoptBackend, make_backend
from kopt.errors import kopt_errors_unwrapped
from kopt.fp8.config import Fp8Config
from kopt.fx.staged_program import MemoStats
from kopt.integrations import installed_version, require, unsupported_reason
from kopt.integrations.text_padding import TextPadding, mask_argument
from kopt.passes.pipeline import PassSpec
from kopt.progress import show_progress
from kopt.report import Report

require("diffusers", "diffusers", "diffusers")

log = logging.getLogger("kopt")
TESTED = ("0.36", "0.43")  # diffusers versions whose pipelines' per-step calls are described above


def _positional_names(function: Any) -> tuple[str, ...]:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


class _CompiledCall:
    """A module's call (or one of its methods) compiled with a kopt backend, with kopt's compile
    progress on the first call and kopt's own errors raised as themselves."""

    def __init__(self, function: Any, backend: KoptBackend, dynamic: bool | None,
                 padding: TextPadding | None, release_weights: bool = False) -> None:
        self.backend, self.padding, self.release_pending = backend, padding, release_weights
        self.compiled = torch.compile(function, backend=backend, dynamic=dynamic)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.padding is not None:
            kwargs = self.padding(kwargs)
        with kopt_errors_unwrapped():
            if self.backend.report.graphs:
                out = self.compiled(*args, **kwargs)
            else:
                with show_progress(self.backend.options.progress):
                    out = self.compiled(*args, **kwargs)
        if self.release_pending:  # the first call compiled the graphs: free the weights none reads
            self.release_pending = False
            self.backend.release_unread_weights()
        return out


@dataclasses.dataclass
class _Installed:
    component: str
    module: torch.nn.Module
    method: str | None  # None: the module's call (``_compiled_call_impl``); else an instance attribute
    previous: Any
    backend: KoptBackend
    padding: TextPadding | None


class PipelineOptimization:
    """What :func:`optimize_pipeline` did to a pipeline (``pipe.kopt``): reports, memo, undo."""

    def __init__(self, pipeline: Any, installed: list[_Installed]) -> None:
        self._pipeline, self._installed = pipeline, installed

    @property
    def reports(self) -> dict[str, Report]:
        """kopt's report per compiled component (``"transformer"``, ``"vae.decode"``, ...)."""
        return {entry.component: entry.backend.report for entry in self._installed}

    @property
    def memo(self) -> MemoStats:
        """The step-invariant memo of the transformer(s), summed over their graphs: with true CFG,
        each step should show one miss (the first half) and one hit (the second)."""
        total = MemoStats()
        for entry in self._installed:
            for graph in entry.backend.report.graphs:
                if graph.memo is not None:
                    total.hits += graph.memo.hits
                    total.misses += graph.memo.misses
                    total.evictions += graph.memo.evictions
                    total.entries += graph.memo.entries
                    total.bypassed += graph.memo.bypassed
        return total

    @property
    def padded_calls(self) -> int:
        """Calls whose text kopt padded to a shared length (:mod:`kopt.integrations.text_padding`)."""
        return sum(entry.padding.padded_calls for entry in self._installed if entry.padding is not None)

    def restore(self) -> Any:
        """Put every compiled component back as it was; returns the pipeline."""
        for entry in reversed(self._installed):
            if entry.method is None:
                entry.module._compiled_call_impl = entry.previous
            elif entry.previous is None:
                del entry.module.__dict__[entry.method]
            else:
                entry.module.__dict__[entry.method] = entry.previous
        self._installed = []
        if self._pipeline.__dict__.get("kopt") is self:
            del self._pipeline.__dict__["kopt"]
        return self._pipeline

    def __repr__(self) -> str:
        memo = self.memo
        return (f"PipelineOptimization(components={list(self.reports)}, memo hits={memo.hits} "
                f"misses={memo.misses}, padded calls={self.padded_calls})")


def _install(pipeline: Any, component: str, passes: PassSpec, fp8: Fp8Config | bool | None,
             text_bucket: int | None, dynamic: bool | None, release_weights: bool,
             options: dict[str, Any]) -> _Installed:
    name, _, method = component.partition(".")
    module = getattr(pipeline, name, None)
    if not isinstance(module, torch.nn.Module):
        raise ValueError(f"pipeline {type(pipeline).__name__} has no module component {name!r} "
                         f"(its components: {sorted(getattr(pipeline, 'components', {}))})")
    backend = make_backend(passes, fp8=fp8, **options)
    if method:
        function = getattr(module, method, None)
        if not callable(function):
            raise ValueError(f"{name}.{method} is not a method of {type(module).__name__}")
        previous = module.__dict__.get(method)
        backend.argument_names = _positional_names(function)
        padding = None
    else:
        function, previous = module._call_impl, module._compiled_call_impl
        backend.argument_names = _positional_names(module.forward)
        mask = mask_argument(module)
        padding = TextPadding(mask, text_bucket) if mask is not None and text_bucket else None
    call = _CompiledCall(function, backend, dynamic, padding, release_weights)
    if method:
        module.__dict__[method] = call
    else:
        module._compiled_call_impl = call
    return _Installed(component, module, method or None, previous, backend, padding)


def optimize_pipeline(pipeline: Any, passes: PassSpec = "auto", *, fp8: Fp8Config | bool | None = None,
                      components: Sequence[str] = ("transformer",), text_bucket: int | None = 64,
                      dynamic: bool | None = False, release_weights: bool = False, **options: Any) -> Any:
    """Compile ``pipeline``'s transformer (or ``components``) with kopt, in place; returns the pipeline.

    Args:
        pipeline: a diffusers ``DiffusionPipeline`` (``FluxPipeline``, ``QwenImagePipeline``, ...).
        passes, fp8: as for :func:`kopt.compile`.
        components: what to compile: a component's name (its call: ``"transformer"``,
            ``"transformer_2"``, ``"text_encoder"``) or ``"name.method"`` (``"vae.decode"``).
        text_bucket: for a transformer that takes a text mask (Qwen-Image), pad its text to a
            multiple of this many tokens so both halves of a CFG pair, and prompts of nearby lengths,
            run one graph and share the step-invariant memo; None keeps the pipeline's shapes.
        dynamic: passed to ``torch.compile``.
        release_weights: after each component's first call, free the weights its compiled graphs do
            not read (with ``fp8``: the bf16 originals), as :func:`kopt.compile`'s option. Off by
            default here, unlike ``kopt.compile`` with ``fp8``: a pipeline compiles again for each
            new text-length bucket or resolution, which a released module cannot (it raises
            :class:`kopt.WeightsReleasedError`); turn it on for a fixed shape to save the memory.
        options: the other keyword arguments of :func:`kopt.compile` (``lower``, ``verify``,
            ``strict``, ``memo_entries``, ``cuda_graphs``, ``progress``, ...).

    ``pipeline.kopt`` is then a :class:`PipelineOptimization`: ``reports``, ``memo``, ``restore()``.
    On a diffusers release outside the tested range the pipeline is returned unchanged, with the
    reason in the ``kopt`` log.
    """
    reason = unsupported_reason("diffusers", installed_version("diffusers"), *TESTED)
    if reason is not None:
        log.warning("kopt.optimize_pipeline: %s", reason)
        return pipeline
    if isinstance(pipeline.__dict__.get("kopt"), PipelineOptimization):
        raise RuntimeError("this pipeline is already optimized by kopt: call pipe.kopt.restore() first")
    installed: list[_Installed] = []
    try:
        for component in components:
            installed.append(_install(pipeline, component, passes, fp8, text_bucket, dynamic, release_weights,
                                      options))
    except Exception:
        PipelineOptimization(pipeline, installed).restore()
        raise
    pipeline.__dict__["kopt"] = PipelineOptimization(pipeline, installed)
    return pipeline


def restore_pipeline(pipeline: Any) -> Any:
    """Undo :func:`optimize_pipeline` (a pipeline it did not touch is returned as is)."""
    state = pipeline.__dict__.get("kopt")
    return state.restore() if isinstance(state, PipelineOptimization) else pipeline
