"""The pass order: one line per pass, with the reason it sits where it does.

``passes="auto"`` runs :func:`default_pipeline`, or :func:`fp8_pipeline` with ``fp8=...``; a list mixes
names from :func:`available_passes` and :class:`~kopt.passes.base.Pass` objects; ``[]`` captures and lowers only.
"""

from __future__ import annotations

from collections.abc import Sequence

from kopt.fp8.config import Fp8Config, Granularity
from kopt.passes.base import Pass
from kopt.passes.fp8.activation_quant import FuseActivationQuant
from kopt.passes.fp8.attention import Fp8Attention
from kopt.passes.fp8.attention_output_quant import FuseAttentionOutputQuant
from kopt.passes.fp8.gemv import Fp8Gemv
from kopt.passes.fp8.linear import Fp8Linear
from kopt.passes.fp8.norm_quant import FuseAdaLNQuant
from kopt.passes.fuse.adaln import FuseAdaLN
from kopt.passes.fuse.attention import FuseAttention
from kopt.passes.fuse.codegen import CodegenFuse
from kopt.passes.fuse.gated_residual import FuseGatedResidual
from kopt.passes.fuse.joint_attention_input import FuseJointAttentionInput
from kopt.passes.fuse.linear_gelu import FuseLinearGelu
from kopt.passes.fuse.qk_norm_rope import FuseQKNormRope
from kopt.passes.fuse.qk_norm_rope_pair import FuseQKNormRopePair
from kopt.passes.fuse.qk_norm_rope_real import FuseQKNormRopeReal
from kopt.passes.graph.bias_absorption import BiasAbsorption
from kopt.passes.graph.concat_split import SplitConcatLinear
from kopt.passes.graph.redundancy import RedundancyElimination
from kopt.passes.graph.residual_fp32 import ResidualStreamFp32
from kopt.passes.graph.sibling_merge import SiblingProjectionMerge
from kopt.passes.graph.staging import BindingTimeStaging

PassSpec = str | Pass | Sequence[str | Pass]


def default_pipeline() -> list[Pass]:
    """The passes ``"auto"`` runs, in order."""
    return [
        RedundancyElimination(),  # first: one node per value, so later matchers see a canonical graph
        SplitConcatLinear(),  # before the merge, which would take a GELU part's linear into Q/K/V's GEMM
        SiblingProjectionMerge(),  # after CSE: siblings then read the very same input node
        BiasAbsorption(),  # after the merge: merged GEMMs keep their bias when a split follows them
        FuseAdaLN(),  # after bias absorption: the absorbed bias adds are part of the regions it matches
        FuseGatedResidual(),  # consumes fuse-adaln's ops (residual + gate feeding the next adaLN)
        FuseQKNormRope(),  # complex RoPE (Qwen-Image), one op per stream
        FuseQKNormRopeReal(),  # real RoPE (FLUX.2), emits the joint op itself for concatenated streams
        FuseJointAttentionInput(),  # joins fuse-qk-norm-rope's per-stream ops into the attention buffer
        FuseQKNormRopePair(),  # after every pass that emits or joins qk_norm_rope ops: pairs what is left
        ResidualStreamFp32(),  # after fuse-gated-residual, whose ops it widens to a float32 stream
        FuseLinearGelu(),  # after bias absorption, whose mm + b it matches as well as addmm
        BindingTimeStaging(),  # last: folds and hoists the final graph (merged modulation GEMMs too)
    ]


def fp8_pipeline(config: Fp8Config) -> list[Pass]:
    """The passes ``"auto"`` runs with ``fp8=config``, in order.

    Row scales have kernels that write FP8 rows themselves (the activation, adaLN and attention
    output fusions) and a GEMV for GEMMs of a few rows; other granularities have none, so there the
    bf16 norm fusions are left out too: Inductor fuses norm and quantize into one kernel, where a
    bf16 kernel would write a tensor that a separate quantize reads back. ``residual-fp32`` is left
    out: it widens the bf16 gated-residual ops, which the FP8 fusions replace by quantizing ones."""
    row = Granularity(config.granularity) is Granularity.ROW
    attention = config.attention
    return [
        RedundancyElimination(),  # first: one node per value, so later matchers see a canonical graph
        SiblingProjectionMerge(),  # after CSE: siblings then read the very same input node
        Fp8Linear(config),  # after the merge (one quantized weight), before bias absorption (bias in epilogue)
        *_when(row, FuseActivationQuant()),  # after fp8-linear: activation + row quantize in one kernel
        BiasAbsorption(),  # after the merge: merged GEMMs keep their bias when a split follows them
        *_when(row, FuseAdaLN()),  # row scales only: fuse-adaln-quant turns its kernels into FP8 writers
        *_when(row, FuseGatedResidual()),  # row scales only, as fuse-adaln
        *_when(row, FuseAdaLNQuant()),  # after the norm fusions whose kernels it turns into FP8 row writers
        FuseQKNormRope(),  # complex RoPE (Qwen-Image), one op per stream
        FuseQKNormRopeReal(),  # real RoPE (FLUX.2), emits the joint op itself for concatenated streams
        FuseJointAttentionInput(),  # joins fuse-qk-norm-rope's per-stream ops into the attention buffer
        FuseQKNormRopePair(),  # after every pass that emits or joins qk_norm_rope ops: pairs what is left
        *_when(attention, Fp8Attention(config)),  # after the Q/K fusions it reads; before staging, which names nodes
        *_when(attention and row, FuseAttentionOutputQuant(config)),  # after fp8-attention: writes FP8 rows
        *_when(row, Fp8Gemv()),  # after every fusion that reads a _scaled_mm node it may replace
        BindingTimeStaging(),  # last: folds and hoists the final graph (merged modulation GEMMs too)
    ]


def _when(condition: bool, rewrite: Pass) -> list[Pass]:
    return [rewrite] if condition else []


def opt_in_passes() -> list[Pass]:
    """Built-in passes not in ``"auto"``: correct and tested, not measured to pay on a GPU in general
    (codegen-fuse; fuse-attention paid at one shape class: the agent's end-to-end
    A/B decides them per model), or added by an option (fp8-linear and its producer fusions, by
    ``fp8=...``). Name them explicitly where each one's ``runs_before`` says (:func:`with_pass`;
    ``staging`` for most: it marks the values it hoists by node name)."""
    return [CodegenFuse(), FuseAttention(), Fp8Linear(), FuseActivationQuant(), FuseAdaLNQuant(),
            Fp8Attention(), FuseAttentionOutputQuant(), Fp8Gemv()]


def added_by_name() -> list[str]:
    """The opt-in passes one adds to a pipeline by name (the agent's "add <pass>" choices, dit.py's
    ``kopt-regional-with-<pass>`` rows): not the FP8 ones, which ``fp8=...`` adds with the producer
    fusions they need (:func:`fp8_into`)."""
    fp8 = {p.name for p in fp8_pipeline(Fp8Config(granularity=Granularity.ROW, attention=True))}  # all of them
    return [p.name for p in opt_in_passes() if p.name not in fp8]


def with_pass(names: Sequence[str], added: str) -> tuple[str, ...]:
    """``names`` with the built-in pass ``added`` inserted right before its ``runs_before`` pass
    (at the end when that one is not listed)."""
    if added in names:
        raise ValueError(f"{added!r} is in the pipeline already")
    before = available_passes()[added].runs_before
    at = list(names).index(before) if before in names else len(names)
    return (*names[:at], added, *names[at:])


def fp8_into(passes: list[Pass], config: Fp8Config) -> list[Pass]:
    """A pass list the caller wrote, with ``fp8=config`` added as :func:`fp8_pipeline` places it.

    ``fp8-linear`` takes the place of one already listed, else follows ``sibling-merge`` (or
    precedes the first of ``bias-absorption``, the norm fusions and ``staging``); with row scales
    ``fuse-activation-quant`` follows it and ``fp8-gemv`` precedes ``staging``; with
    ``Fp8Config(attention=True)`` ``fp8-attention`` (and, with row scales,
    ``fuse-attention-output-quant``) precede ``staging``. Nothing the caller listed is dropped
    or moved: only ``"auto"`` (:func:`fp8_pipeline`) chooses which bf16 fusions suit FP8."""
    row = Granularity(config.granularity) is Granularity.ROW
    fp8 = [Fp8Linear(config), *_when(row, FuseActivationQuant())]
    attention = [*_when(config.attention, Fp8Attention(config)),
                 *_when(config.attention and row, FuseAttentionOutputQuant(config))]
    replaced = {"fp8-linear", "fuse-activation-quant", *(p.name for p in attention)}
    names = [p.name for p in passes]
    if "fp8-linear" in names:
        at = names.index("fp8-linear")
    elif "sibling-merge" in names:
        at = names.index("sibling-merge") + 1
    else:
        later = [names.index(n) for n in ("bias-absorption", "fuse-adaln", "fuse-gated-residual", "staging")
                 if n in names]
        at = min(later) if later else len(passes)
    kept = [p for p in passes[:at] if p.name not in replaced]
    rest = [p for p in passes[at:] if p.name not in replaced]
    passes = [*kept, *fp8, *rest]
    names = [p.name for p in passes]
    staging = names.index("staging") if "staging" in names else len(passes)  # staging names nodes: run before it
    gemv = _when(row and "fp8-gemv" not in names, Fp8Gemv())
    return [*passes[:staging], *attention, *gemv, *passes[staging:]]


def available_passes() -> dict[str, Pass]:
    """Every built-in pass by name (``kopt passes`` lists these)."""
    return {p.name: p for p in default_pipeline() + opt_in_passes()}


def resolve(spec: PassSpec, fp8: Fp8Config | None = None) -> list[Pass]:
    """Turn ``"auto"``, a pass name, a Pass, or a list mixing them into an ordered list of passes.

    With ``fp8``, ``"auto"`` stands for :func:`fp8_pipeline`; a list without ``"auto"`` gets the
    FP8 passes added as :func:`fp8_into` says."""
    if isinstance(spec, (str, Pass)):
        spec = [spec]
    auto = default_pipeline() if fp8 is None else fp8_pipeline(fp8)
    known = available_passes()
    resolved: list[Pass] = []
    for item in spec:
        if isinstance(item, Pass):
            resolved.append(item)
        elif item == "auto":
            resolved.extend(auto)
        elif isinstance(item, str) and item in known:
            resolved.append(known[item])
        else:
            raise ValueError(f"unknown pass {item!r}: use 'auto', a kopt.Pass, or one of {sorted(known)}")
    if fp8 is not None and "auto" not in spec:
        resolved = fp8_into(resolved, fp8)
    names = [p.name for p in resolved]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ValueError(f"pass(es) listed twice: {sorted(duplicates)}")
    return resolved
