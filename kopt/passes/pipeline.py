"""The pass order: one line per pass, with the reason it sits where it does.

``passes="auto"`` runs :func:`default_pipeline`; a list mixes names from :func:`available_passes`
and :class:`~kopt.passes.base.Pass` objects; ``[]`` captures and lowers only.
"""

from __future__ import annotations

from collections.abc import Sequence

from kopt.fp8.config import Fp8Config, Granularity
from kopt.passes.base import Pass
from kopt.passes.graph.bias_absorption import BiasAbsorption
from kopt.passes.graph.redundancy import RedundancyElimination
from kopt.passes.graph.sibling_merge import SiblingProjectionMerge
from kopt.passes.graph.staging import BindingTimeStaging

PassSpec = str | Pass | Sequence[str | Pass]


def default_pipeline() -> list[Pass]:
    """The passes ``"auto"`` runs, in order (each measured on the H200: benchmarks/results/NOTES.md)."""
    from kopt.passes.fuse.adaln import FuseAdaLN
    from kopt.passes.fuse.gated_residual import FuseGatedResidual
    from kopt.passes.fuse.joint_attention_input import FuseJointAttentionInput
    from kopt.passes.fuse.qk_norm_rope import FuseQKNormRope
    from kopt.passes.fuse.qk_norm_rope_real import FuseQKNormRopeReal

    return [
        RedundancyElimination(),  # first: one node per value, so later matchers see a canonical graph
        SiblingProjectionMerge(),  # after CSE: siblings then read the very same input node
        BiasAbsorption(),  # after the merge: merged GEMMs keep their bias when a split follows them
        FuseAdaLN(),  # after bias absorption: the absorbed bias adds are part of the regions it matches
        FuseGatedResidual(),  # consumes fuse-adaln's ops (residual + gate feeding the next adaLN)
        FuseQKNormRope(),  # complex RoPE (Qwen-Image), one op per stream
        FuseQKNormRopeReal(),  # real RoPE (FLUX.2), emits the joint op itself for concatenated streams
        FuseJointAttentionInput(),  # joins fuse-qk-norm-rope's per-stream ops into the attention buffer
        BindingTimeStaging(),  # last: folds and hoists the final graph (merged modulation GEMMs too)
    ]


# Kernel fusions whose bf16 output feeds FP8 GEMMs. With row scales fuse-adaln-quant makes their
# kernels emit the FP8 rows themselves; with other granularities their output would reach the GEMM
# through a separate quantize kernel (Inductor's norm + quantize fusion reads it once less).
_BF16_PRODUCERS = ("fuse-adaln", "fuse-gated-residual")


def opt_in_passes() -> list[Pass]:
    """Built-in passes not in ``"auto"``: correct and tested, not measured to pay on a GPU
    (codegen-fuse), or added by an option (fp8-linear and its producer fusions, by ``fp8=...``).
    Name them explicitly, before ``staging`` (which marks the values it hoists by node name)."""
    from kopt.passes.fuse.codegen import CodegenFuse
    from kopt.passes.fp8.attention import Fp8Attention
    from kopt.passes.fp8.gemv import Fp8Gemv
    from kopt.passes.fp8.linear import Fp8Linear
    from kopt.passes.fp8.activation_quant import FuseActivationQuant
    from kopt.passes.fp8.norm_quant import FuseAdaLNQuant
    from kopt.passes.fp8.attention_output_quant import FuseAttentionOutputQuant

    return [CodegenFuse(), Fp8Linear(), FuseActivationQuant(), FuseAdaLNQuant(), Fp8Attention(),
            FuseAttentionOutputQuant(), Fp8Gemv()]


def with_fp8(passes: list[Pass], config: Fp8Config, from_auto: bool = True) -> list[Pass]:
    """``passes`` with an :class:`Fp8Linear` for ``config``: in place of an ``fp8-linear`` already
    listed, else right after ``sibling-merge`` (merged weights are quantized as one), i.e. before
    ``bias-absorption`` (the bias then stays in the FP8 GEMM's epilogue) and before ``staging``.
    With row-wise scales ``fuse-activation-quant`` (SwiGLU / GELU-tanh → FP8 in one kernel) follows it.
    ``Fp8Config(attention=True)`` adds ``fp8-attention`` just before ``staging`` (with row scales,
    followed by ``fuse-attention-output-quant``). With row scales ``fp8-gemv`` runs last before
    ``staging``: the GEMMs of a few rows (the modulation of a timestep embedding) it may turn into
    ``kopt::fp8_gemv`` are no longer ``_scaled_mm`` nodes for the fusions before it to read.

    When the passes come from ``"auto"`` (``from_auto``; ``kopt.compile`` decides), kopt also picks
    what the bf16 norm fusions (``fuse-adaln``, ``fuse-gated-residual``) become: with row scales
    ``fuse-adaln-quant`` follows them and turns their kernels into ones that write the FP8 rows
    themselves; other granularities have no such kernels, so the norm fusions are dropped and
    Inductor fuses norm and quantize into one kernel (a bf16 kernel would write a tensor that a
    separate quantize reads back). A list the caller wrote is kept as written."""
    from kopt.passes.fp8.linear import Fp8Linear
    from kopt.passes.fp8.activation_quant import FuseActivationQuant
    from kopt.passes.fp8.norm_quant import FuseAdaLNQuant

    fp8 = Fp8Linear(config)
    row = Granularity(config.granularity) is Granularity.ROW
    producers: list[Pass] = [FuseActivationQuant()] if row else []
    dropped = {"fuse-activation-quant"}
    if from_auto:
        dropped |= {"fuse-adaln-quant"} | (set() if row else set(_BF16_PRODUCERS))
    passes = [p for p in passes if p.name not in dropped]
    names = [p.name for p in passes]
    if fp8.name in names:
        at = names.index(fp8.name)
        passes = [*passes[:at], fp8, *producers, *passes[at + 1:]]
    else:
        if "sibling-merge" in names:
            at = names.index("sibling-merge") + 1
        else:
            later = [names.index(n) for n in ("bias-absorption", *_BF16_PRODUCERS, "staging") if n in names]
            at = min(later) if later else len(passes)
        passes = [*passes[:at], fp8, *producers, *passes[at:]]
    names = [p.name for p in passes]
    norms = [names.index(n) for n in _BF16_PRODUCERS if n in names]
    if from_auto and row and norms:
        at = max(norms) + 1
        passes = [*passes[:at], FuseAdaLNQuant(), *passes[at:]]
    if config.attention:
        from kopt.passes.fp8.attention import Fp8Attention
        from kopt.passes.fp8.attention_output_quant import FuseAttentionOutputQuant

        attention: list[Pass] = [Fp8Attention(config)]
        if row:  # the projections after attention quantize per row: the attention kernel writes FP8 itself
            attention.append(FuseAttentionOutputQuant(config))
        passes = [p for p in passes if p.name not in ("fp8-attention", "fuse-attention-output-quant")]
        names = [p.name for p in passes]
        at = names.index("staging") if "staging" in names else len(passes)  # staging names nodes: run before it
        passes = [*passes[:at], *attention, *passes[at:]]
    names = [p.name for p in passes]
    if row and "fp8-gemv" not in names:
        from kopt.passes.fp8.gemv import Fp8Gemv

        at = names.index("staging") if "staging" in names else len(passes)  # after every fusion reading the GEMMs
        passes = [*passes[:at], Fp8Gemv(), *passes[at:]]
    return passes


def available_passes() -> dict[str, Pass]:
    """Every built-in pass by name (``kopt passes`` lists these)."""
    return {p.name: p for p in default_pipeline() + opt_in_passes()}


def resolve(spec: PassSpec) -> list[Pass]:
    """Turn ``"auto"``, a pass name, a Pass, or a list mixing them into an ordered list of passes."""
    if isinstance(spec, (str, Pass)):
        spec = [spec]
    known = available_passes()
    resolved: list[Pass] = []
    for item in spec:
        if isinstance(item, Pass):
            resolved.append(item)
        elif item == "auto":
            resolved.extend(default_pipeline())
        elif isinstance(item, str) and item in known:
            resolved.append(known[item])
        else:
            raise ValueError(f"unknown pass {item!r}: use 'auto', a kopt.Pass, or one of {sorted(known)}")
    names = [p.name for p in resolved]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ValueError(f"pass(es) listed twice: {sorted(duplicates)}")
    return resolved
