"""The pass order: one line per pass, with the reason it sits where it does.

``passes="auto"`` runs :func:`default_pipeline`; a list mixes names from :func:`available_passes`
and :class:`~kopt.passes.base.Pass` objects; ``[]`` captures and lowers only.
"""

from __future__ import annotations

from collections.abc import Sequence

from kopt.fp8.config import Fp8Config, Granularity
from kopt.passes.base import Pass
from kopt.passes.bias_absorption import BiasAbsorption
from kopt.passes.redundancy import RedundancyElimination
from kopt.passes.sibling_merge import SiblingProjectionMerge
from kopt.passes.staging import BindingTimeStaging

PassSpec = str | Pass | Sequence[str | Pass]


def default_pipeline() -> list[Pass]:
    """The passes ``"auto"`` runs, in order (each measured on the H200: benchmarks/results/NOTES.md)."""
    from kopt.passes.fuse_adaln import FuseAdaLN
    from kopt.passes.fuse_gated_residual import FuseGatedResidual
    from kopt.passes.fuse_joint_attention_input import FuseJointAttentionInput
    from kopt.passes.fuse_qk_norm_rope import FuseQKNormRope
    from kopt.passes.fuse_qk_norm_rope_real import FuseQKNormRopeReal

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


# Kernel fusions whose output a bf16 op produces for an FP8 GEMM: until their kernels emit FP8
# directly, Inductor's own norm + quantize fusion reads the value once less, so fp8=... drops them.
_BF16_PRODUCERS = ("fuse-adaln", "fuse-gated-residual")


def opt_in_passes() -> list[Pass]:
    """Built-in passes not in ``"auto"``: correct and tested, not measured to pay on a GPU
    (codegen-fuse), or added by an option (fp8-linear and its producer fusions, by ``fp8=...``).
    Name them explicitly, before ``staging`` (which marks the values it hoists by node name)."""
    from kopt.passes.codegen_fuse import CodegenFuse
    from kopt.passes.fp8_linear import Fp8Linear
    from kopt.passes.fuse_activation_quant import FuseActivationQuant
    from kopt.passes.fuse_adaln_quant import FuseAdaLNQuant

    return [CodegenFuse(), Fp8Linear(), FuseActivationQuant(), FuseAdaLNQuant()]


def with_fp8(passes: list[Pass], config: Fp8Config, drop_bf16_producers: bool = True) -> list[Pass]:
    """``passes`` with an :class:`Fp8Linear` for ``config``: in place of an ``fp8-linear`` already
    listed, else right after ``sibling-merge`` (merged weights are quantized as one), i.e. before
    ``bias-absorption`` (the bias then stays in the FP8 GEMM's epilogue) and before ``staging``.
    With row-wise scales the producer fusions that emit FP8 directly follow it
    (``fuse-activation-quant``). With ``drop_bf16_producers`` (``kopt.compile`` sets it when the
    passes come from ``"auto"``) the bf16 norm fusions (``fuse-adaln``, ``fuse-gated-residual``)
    are dropped, since their outputs would reach the FP8 GEMMs through a separate quantize; passes
    the caller named explicitly are kept."""
    from kopt.passes.fp8_linear import Fp8Linear
    from kopt.passes.fuse_activation_quant import FuseActivationQuant

    fp8 = Fp8Linear(config)
    producers = [] if Granularity(config.granularity) is not Granularity.ROW else [FuseActivationQuant()]
    dropped = set(_BF16_PRODUCERS) if drop_bf16_producers else set()
    passes = [p for p in passes if p.name not in {q.name for q in producers} | dropped]
    names = [p.name for p in passes]
    if fp8.name in names:
        at = names.index(fp8.name)
        return [*passes[:at], fp8, *producers, *passes[at + 1:]]
    if "sibling-merge" in names:
        at = names.index("sibling-merge") + 1
    else:
        later = [names.index(n) for n in ("bias-absorption", "fuse-adaln", "fuse-adaln-quant", "staging")
                 if n in names]
        at = min(later) if later else len(passes)
    return [*passes[:at], fp8, *producers, *passes[at:]]


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
