"""The rows of the DiT benchmark: how each variant turns the eager model into something callable.

A variant is a :class:`Variant`: a name (the row label), a ``prepare`` function returning a
:class:`Prepared` (the callable, notes for the table, an optional kopt report, and an ``undo`` that
restores the shared eager model), and whether it also gets a CFG-pair row. To add a kopt option,
add one line to :data:`KOPT_OPTIONS`; to add anything else, append a :class:`Variant` to
:func:`all_variants`.

The model is built once per process and shared, so variants must leave it as they found it;
the FP8 variants cannot (they drop bf16 weights, as kopt's FP8 does by default: ``release_weights``)
and so are marked ``mutates_model`` and run after all the others; the harness builds the model
again, from the same seed, before each one after the first (``dit.rebuild_model``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks.dit.fp8_baseline import count_fp8_linears, quantize_linears, set_fast_accum
from kopt.fp8 import Fp8Config


@dataclasses.dataclass(frozen=True)
class Setup:
    """What a variant may need to know about the run."""

    size: str
    device: torch.device
    dtype: torch.dtype

    @property
    def fp8_min_features(self) -> int:
        """Linears smaller than this stay bf16 (tiny models have 64-wide layers, full ones >= 3072)."""
        return 1024 if self.size == "full" else 16


@dataclasses.dataclass
class Prepared:
    """A variant ready to call with the workload's keyword inputs."""

    fn: Callable[..., Any]
    notes: list[str] = dataclasses.field(default_factory=list)
    kopt_report: Any = None  # kopt.Report for kopt variants (filled in after the first call)
    undo: Callable[[], None] = lambda: None
    replay: Callable[[], str] | None = None  # whole-forward CUDA-graph replay's status (baselines that replay)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One benchmark row family (forward, and the CFG pair when ``cfg_pair``)."""

    name: str
    description: str
    prepare: Callable[[nn.Module, Setup], Prepared]
    cfg_pair: bool = False
    mutates_model: bool = False  # leaves the model changed or unusable: run last, on a model built again
    estimate_full_s: float = 60.0  # rough wall seconds at full size (compile + timing + profile)
    aliases: tuple[str, ...] = ()


# ---------------------------------------------------------------- eager and torch.compile


def _eager(model: nn.Module, setup: Setup) -> Prepared:
    return Prepared(model)


def _uncompile_blocks(model: nn.Module) -> None:
    """Undo ``compile_repeated_blocks`` / :func:`compile_regions`."""
    from kopt.regional import uncompile_blocks

    uncompile_blocks(model)


def compile_regions(model: nn.Module, backend: Any = None) -> str:
    """``torch.compile`` (default mode; ``backend`` when given) on each repeated block; returns which
    blocks, for the notes. The blocks are :func:`kopt.regional.repeated_blocks`' (diffusers'
    ``_repeated_blocks``, as ``compile_repeated_blocks()`` compiles them; otherwise, for SD3, Sana,
    PixArt, transformers LLMs, ..., the items of each outermost ModuleList)."""
    from kopt.regional import compile_blocks

    names = ", ".join(compile_blocks(model, backend if backend is not None else "inductor", isolate=False))
    declared = bool(getattr(model, "_repeated_blocks", None))
    return names if declared else f"{names} (ModuleList items: the model declares no _repeated_blocks)"


def _regional_compile(model: nn.Module, setup: Setup) -> Prepared:
    """Regional ``torch.compile``: each repeated block compiled on its own (:func:`compile_regions`)."""
    return Prepared(model, notes=[f"regional: {compile_regions(model)}"], undo=lambda: _uncompile_blocks(model))


def _regional_compile_tuned(model: nn.Module, setup: Setup) -> Prepared:
    """Regional ``torch.compile`` with ``mode="max-autotune-no-cudagraphs"``: each block's GEMMs timed among
    Inductor's Triton templates and cuBLAS, its generated kernels' launch configs tuned (the replay is ours)."""
    from kopt.regional import repeated_blocks

    blocks = repeated_blocks(model)
    for block in blocks:
        block.compile(backend="inductor", mode="max-autotune-no-cudagraphs")
    names = ", ".join(sorted({type(b).__name__ for b in blocks}))
    return Prepared(model, notes=[f"regional, max-autotune: {names}"], undo=lambda: _uncompile_blocks(model))


def _replayed(prepared: Prepared, setup: Setup) -> Prepared:
    """``prepared`` with its whole forward replayed from a CUDA graph (:mod:`benchmarks.dit.graph_replay`),
    as kopt replays its own: on the CPU there is nothing to replay and the row says so."""
    from benchmarks.dit.graph_replay import ReplayedForward

    if setup.device.type != "cuda":
        return dataclasses.replace(prepared, notes=[*prepared.notes, "CPU: no CUDA graph"],
                                   replay=lambda: "not replayed: CPU")
    replayed = ReplayedForward(prepared.fn)
    return dataclasses.replace(prepared, fn=replayed, notes=[*prepared.notes, "whole forward as one CUDA graph"],
                               replay=replayed.status)


def _whole_compile(model: nn.Module, setup: Setup) -> Prepared:
    return Prepared(torch.compile(model), notes=["whole model, default mode"])


# ---------------------------------------------------------------- FP8 baseline


def _fp8(model: nn.Module, setup: Setup, *, compile_blocks: bool, fast_accum: bool = False) -> Prepared:
    """Quantize the blocks' large linears (once per process), then optionally compile regionally.
    ``fast_accum``: their GEMMs use cuBLAS' fast FP8 accumulation (kopt's default), for a like-for-like row."""
    notes: list[str] = []
    if count_fp8_linears(model) == 0:
        _, notes = quantize_linears(model, min_features=setup.fp8_min_features)
    else:
        notes = [f"reused {count_fp8_linears(model)} FP8 linears quantized by an earlier variant"]
    set_fast_accum(model, fast_accum)
    if fast_accum:
        notes.append("fast FP8 accumulation")
    if compile_blocks:
        notes.append(f"regional torch.compile on top: {compile_regions(model)}")
    return Prepared(model, notes=notes, undo=lambda: _uncompile_blocks(model))


# ---------------------------------------------------------------- kopt

# name -> keyword arguments of kopt.compile; one line per kopt option worth a row.
KOPT_OPTIONS: dict[str, dict[str, Any]] = {
    "kopt": dict(passes="auto"),  # lower="inductor" (default)
    "kopt-eager": dict(passes="auto", lower="eager"),  # rewritten FX graph op by op: fast to compile
    # the measured configuration of issue 5 spelled out (since it became "auto", the same as "kopt")
    "kopt-fused": dict(passes=["redundancy", "sibling-merge", "bias-absorption", "fuse-adaln",
                               "fuse-gated-residual", "fuse-qk-norm-rope", "fuse-qk-norm-rope-real",
                               "fuse-joint-attention-input", "staging"]),
    # the pipeline before the kernel fusions joined "auto" (issue 4's ablation baseline)
    "kopt-graph-only": dict(passes=["redundancy", "sibling-merge", "bias-absorption", "staging"]),
    # weight changes noticed by version counter and storage only (no per-call checksum of the watched weights)
    "kopt-version-check": dict(passes="auto", weight_check="version"),
    # kernel by kernel, without CUDA-graph replay (the default since kopt.cuda_graphs)
    "kopt-no-graphs": dict(passes="auto", cuda_graphs=False),
    # auto plus row-wise FP8 linears: weights quantized at compile time, every producer emitting FP8
    "kopt-fp8": dict(passes="auto", fp8=Fp8Config()),
    "kopt-fp8-no-graphs": dict(passes="auto", fp8=Fp8Config(), cuda_graphs=False),
    # the FP8 configuration measured at 79efcc0: bf16 norm fusions left out, Inductor fuses norm + quantize
    "kopt-fp8-inductor-norms": dict(passes=["redundancy", "sibling-merge", "bias-absorption", "fuse-qk-norm-rope",
                                            "fuse-qk-norm-rope-real", "fuse-joint-attention-input", "staging"],
                                    fp8=Fp8Config()),
    # FP8 linears and FP8 attention (kopt::fp8_attention: Q per row, K and V per key tile)
    "kopt-fp8-attn": dict(passes="auto", fp8=Fp8Config(attention=True)),
    # regional with FP8 linears and bf16 attention (the library's kernel): what FP8 attention adds, or costs
    "kopt-regional-fp8": dict(passes="auto", regional=True, fp8=Fp8Config()),
    # regional compilation (compile time of a few blocks) with FP8 linears and attention
    "kopt-regional-fp8-attn": dict(passes="auto", regional=True, fp8=Fp8Config(attention=True)),
    # regional with the model's code around the module that runs the blocks compiled too (an LLM's LM head
    # and logit soft cap as one graph: kopt.between_blocks)
    "kopt-regional-outer": dict(passes="auto", regional=True, between_blocks="outer"),
    # regional with all of the model's own code compiled, each block call one op in its graph (kopt.opaque_blocks):
    # FLUX.1's guidance scaled without eager's rounding, the embeddings and output layers fused
    "kopt-regional-compiled": dict(passes="auto", regional=True, between_blocks="compiled"),
    "kopt-regional-compiled-fp8-attn": dict(passes="auto", regional=True, fp8=Fp8Config(attention=True),
                                            between_blocks="compiled"),
    # regional with Inductor's tuning for every graph (GEMM templates against cuBLAS, launch configs; CUDA graphs on):
    # what the agent's lowering choices try graph by graph, against torch.compile-max-autotune+graphs
    "kopt-regional-max-autotune": dict(passes="auto", regional=True, mode="max-autotune"),
    # FP8 keeping the module's bf16 weights (release_weights=False): their memory and per-call checksum
    "kopt-regional-fp8-attn-keep-weights": dict(passes="auto", regional=True, fp8=Fp8Config(attention=True),
                                                release_weights=False),
    # regional bf16 with weight changes noticed by version counter and storage only (no comparison on a side stream)
    "kopt-regional-version-check": dict(passes="auto", regional=True, weight_check="version"),
    # the same without the per-call checksum of the bf16 weights behind the FP8 copies (what it costs)
    "kopt-regional-fp8-attn-version-check": dict(passes="auto", regional=True, fp8=Fp8Config(attention=True),
                                                 weight_check="version"),
    # what the per-call checksum of the bf16 weights behind the FP8 copies costs (they are not checksummed here)
    "kopt-fp8-attn-version-check": dict(passes="auto", fp8=Fp8Config(attention=True), weight_check="version"),
    # the same with float32 accumulation in the FP8 GEMMs (the default is cuBLAS' fast accumulation)
    "kopt-fp8-f32-accum": dict(passes="auto", fp8=Fp8Config(fast_accum=False)),
    "kopt-fp8-attn-f32-accum": dict(passes="auto", fp8=Fp8Config(attention=True, fast_accum=False)),
    # DeepSeek-V3 block scales: 1x128 activation slices, 128x128 weight tiles (cuBLAS block-scaled GEMM)
    "kopt-fp8-block": dict(passes="auto", fp8=Fp8Config(granularity="block-128x128")),
}


def _ablations() -> dict[str, dict[str, Any]]:
    """``kopt-no-<pass>``: the default pipeline with one pass left out (the ablation table), whole-model
    and with ``regional=True`` (``kopt-regional-no-<pass>``: what the agent's choice "drop <pass>"
    measures, here against the replaying baselines)."""
    from kopt.passes.pipeline import default_pipeline

    names = [p.name for p in default_pipeline()]
    ablations = {f"kopt-no-{name}": dict(passes=[n for n in names if n != name]) for name in names}
    ablations.update({f"kopt-regional-no-{name}": dict(passes=[n for n in names if n != name], regional=True)
                      for name in names if name != "staging"})
    return ablations


def _opt_ins() -> dict[str, dict[str, Any]]:
    """``kopt-regional-with-<pass>``: regional kopt with one opt-in pass added where it runs
    (:func:`kopt.passes.pipeline.with_pass`: what the agent's pipeline choice ``add <pass>``
    measures, here against the replaying baselines)."""
    from kopt.passes.pipeline import added_by_name, default_pipeline, with_pass

    names = tuple(p.name for p in default_pipeline())
    return {f"kopt-regional-with-{extra}": dict(passes=list(with_pass(names, extra)), regional=True)
            for extra in added_by_name()}


KOPT_OPTIONS.update(_ablations())
KOPT_OPTIONS.update(_opt_ins())
# an LLM's agent default (the LM head and logit cap one graph) with its one candidate that has room: the
# capped-attention kernel (Gemma 2)
KOPT_OPTIONS["kopt-regional-outer-with-fuse-attention"] = dict(KOPT_OPTIONS["kopt-regional-with-fuse-attention"],
                                                              between_blocks="outer")


def _kopt(options: dict[str, Any]) -> Callable[[nn.Module, Setup], Prepared]:
    def prepare(model: nn.Module, setup: Setup) -> Prepared:
        import kopt

        compiled = kopt.compile(model, **options)
        described = ", ".join(f"{k}={v!r}" for k, v in options.items())
        undo = compiled.undo if options.get("regional") else (lambda: None)  # regional: blocks compiled in place
        return Prepared(compiled, notes=[f"kopt.compile({described})"], kopt_report=compiled.kopt_report, undo=undo)

    return prepare


def _releases(options: dict[str, Any]) -> bool:
    """Whether ``kopt.compile(**options)`` frees the module's weights after its first call."""
    from kopt.release import release_by_default

    chosen = options.get("release_weights")
    return release_by_default(options.get("fp8"), bool(options.get("regional"))) if chosen is None else bool(chosen)


def _without_pdl(prepare: Callable[[nn.Module, Setup], Prepared]) -> Callable[[nn.Module, Setup], Prepared]:
    """``prepare`` with kopt's kernels launched without programmatic dependent launch (``KOPT_PDL=0``) for
    as long as the variant lives: its CUDA graphs are recorded after ``prepare`` returns, at the first calls,
    and keep the launch attributes they were recorded with. Measures what PDL does next to library
    kernels (cuBLAS, cuDNN) that may let a dependent launch while they still run."""
    import os

    def prepare_without(model: nn.Module, setup: Setup) -> Prepared:
        before = os.environ.get("KOPT_PDL")
        os.environ["KOPT_PDL"] = "0"
        prepared = prepare(model, setup)

        def undo() -> None:
            prepared.undo()
            if before is None:
                os.environ.pop("KOPT_PDL", None)
            else:
                os.environ["KOPT_PDL"] = before

        return dataclasses.replace(prepared, notes=[*prepared.notes, "KOPT_PDL=0"], undo=undo)

    return prepare_without


# ---------------------------------------------------------------- the registry


def all_variants() -> list[Variant]:
    """Every known variant, in the default run order (model-mutating ones last)."""
    variants = [
        Variant("eager", "eager bf16 (the reference)", _eager, cfg_pair=True, estimate_full_s=20),
        Variant("torch.compile", "regional torch.compile (compile_repeated_blocks, else each ModuleList block)",
                _regional_compile, cfg_pair=True, estimate_full_s=150, aliases=("compile", "regional")),
        Variant("torch.compile+graphs", "regional torch.compile, whole forward replayed from a CUDA graph",
                lambda m, s: _replayed(_regional_compile(m, s), s), cfg_pair=True, estimate_full_s=150,
                aliases=("compile+graphs",)),
        Variant("torch.compile-max-autotune+graphs", "regional torch.compile with mode='max-autotune-no-cudagraphs', "
                "whole forward replayed from a CUDA graph (the baseline for kopt-regional-max-autotune)",
                lambda m, s: _replayed(_regional_compile_tuned(m, s), s), cfg_pair=True, estimate_full_s=400),
        Variant("kopt-regional", "kopt.compile(regional=True): each repeated block compiled once per class, "
                "the whole forward replayed from a CUDA graph (kopt.forward_replay)",
                _kopt(dict(passes="auto", regional=True)), cfg_pair=True, estimate_full_s=120),
        Variant("torch.compile-full", "whole-model torch.compile", _whole_compile,
                estimate_full_s=420, aliases=("compile-full", "whole")),
        Variant("torch.compile-full+graphs", "whole-model torch.compile, the forward replayed from a CUDA graph "
                "(an LLM user's torch.compile: the code between the blocks compiled too)",
                lambda m, s: _replayed(_whole_compile(m, s), s), estimate_full_s=420),
    ]
    estimates = {"kopt-eager": 120}  # FLUX.1-dev config on an H200: ~125 s compile, timing and profile
    variants += [Variant(name, f"kopt.compile with {options}", _kopt(options), cfg_pair=True,
                         mutates_model=_releases(options), estimate_full_s=estimates.get(name, 150))
                 for name, options in KOPT_OPTIONS.items()]
    variants += [Variant(f"{name}-nopdl", f"{name} with KOPT_PDL=0 (no programmatic dependent launch)",
                         _without_pdl(_kopt(options)), cfg_pair=True, mutates_model=_releases(options),
                         estimate_full_s=120)
                 for name, options in (("kopt-regional", dict(passes="auto", regional=True)),
                                       ("kopt-regional-fp8", KOPT_OPTIONS["kopt-regional-fp8"]),
                                       ("kopt-regional-fp8-attn", KOPT_OPTIONS["kopt-regional-fp8-attn"]))]
    variants += [
        Variant("fp8+torch.compile", "rowwise FP8 linears + regional torch.compile",
                lambda m, s: _fp8(m, s, compile_blocks=True), mutates_model=True, cfg_pair=True,
                estimate_full_s=90, aliases=("fp8",)),
        Variant("fp8+torch.compile-fast-accum", "rowwise FP8 linears with fast accumulation + regional torch.compile",
                lambda m, s: _fp8(m, s, compile_blocks=True, fast_accum=True), mutates_model=True, cfg_pair=True,
                estimate_full_s=90),
        Variant("fp8+torch.compile-fast-accum+graphs",
                "rowwise FP8 linears with fast accumulation + regional torch.compile, whole forward replayed "
                "from a CUDA graph", lambda m, s: _replayed(_fp8(m, s, compile_blocks=True, fast_accum=True), s),
                mutates_model=True, cfg_pair=True, estimate_full_s=90, aliases=("fp8+graphs",)),
        Variant("fp8-eager", "rowwise FP8 linears, no compile", lambda m, s: _fp8(m, s, compile_blocks=False),
                mutates_model=True, cfg_pair=True, estimate_full_s=60),
    ]
    return variants


DEFAULT_FULL = ("eager", "torch.compile", "torch.compile+graphs", "kopt", "fp8+torch.compile-fast-accum+graphs")
DEFAULT_TINY = tuple(v.name for v in all_variants()
                     if not v.name.startswith(("kopt-no-", "kopt-regional-no-", "kopt-fused"))
                     and not v.name.endswith(("-nopdl", "-keep-weights"))
                     and v.name not in ("kopt-regional-outer", "kopt-regional-outer-with-fuse-attention",
                                        "torch.compile-full+graphs")  # LLM rows; no CPU graphs
                     and "max-autotune" not in v.name)  # on a CPU it tunes C++ GEMM templates for minutes


def select(spec: str, size: str, whole_model: bool) -> list[Variant]:
    """Variants named in ``spec`` (comma-separated names or aliases, or "auto"), in a safe order.

    "auto" is every variant at tiny size and :data:`DEFAULT_FULL` at full size (whole-model
    compile only with ``whole_model``: it may not finish inside one 10-minute device call).
    Model-mutating variants are moved after the others, keeping the requested order otherwise.
    """
    known = {alias: v for v in all_variants() for alias in (v.name, *v.aliases)}
    if spec == "auto":
        names = list(DEFAULT_TINY if size == "tiny" else DEFAULT_FULL)
        if size == "full" and whole_model:
            names.insert(2, "torch.compile-full")
    else:
        names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}: choose from {sorted(known)}")
    chosen = list(dict.fromkeys(known[n].name for n in names))
    if whole_model and "torch.compile-full" not in chosen:
        chosen.append("torch.compile-full")
    ordered = [known[n] for n in chosen]
    return [v for v in ordered if not v.mutates_model] + [v for v in ordered if v.mutates_model]
