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
    """The passes ``"auto"`` runs, in order."""
    return [
        RedundancyElimination(),  # first: one node per value, so later matchers see a canonical graph
        SiblingProjectionMerge(),  # after CSE: siblings then read the very same input node
        BiasAbsorption(),  # after the merge: merged GEMMs keep their bias when a split follows them
        BindingTimeStaging(),  # last: folds and hoists the final graph (merged modulation GEMMs too)
    ]


def opt_in_passes() -> list[Pass]:
    """Built-in passes not in ``"auto"`` yet: correct and tested, not yet measured to pay on a GPU.
    Name them explicitly, before ``staging`` (which marks the values it hoists by node name)."""
    from kopt.passes.codegen_fuse import CodegenFuse
    from kopt.passes.fp8_linear import Fp8Linear

    # in this order: fuse-gated-residual consumes fuse-adaln's ops; the joint attention input
    # joins the per-stream ops fuse-qk-norm-rope made (the real form emits its joint op itself);
    # codegen-fuse after the hand-written fusions, so it only generates kernels for the elementwise
    # regions they left. fp8-linear (default Fp8Config) is usually added by kopt.compile(fp8=...).
    from kopt.passes.fuse_activation_quant import FuseActivationQuant
    from kopt.passes.fuse_adaln import FuseAdaLN
    from kopt.passes.fuse_gated_residual import FuseGatedResidual
    from kopt.passes.fuse_joint_attention_input import FuseJointAttentionInput
    from kopt.passes.fuse_qk_norm_rope import FuseQKNormRope
    from kopt.passes.fuse_qk_norm_rope_real import FuseQKNormRopeReal

    return [FuseAdaLN(), FuseGatedResidual(), FuseQKNormRope(), FuseQKNormRopeReal(), FuseJointAttentionInput(),
            CodegenFuse(), Fp8Linear(), FuseActivationQuant()]


def with_fp8(passes: list[Pass], config: Fp8Config) -> list[Pass]:
    """``passes`` with an :class:`Fp8Linear` for ``config``: in place of an ``fp8-linear`` already
    listed, else right after ``sibling-merge`` (merged weights are quantized as one), i.e. before
    ``bias-absorption`` (the bias then stays in the FP8 GEMM's epilogue) and before ``staging``.
    With row-wise scales the producer fusions that emit FP8 directly follow it
    (``fuse-activation-quant``)."""
    from kopt.passes.fp8_linear import Fp8Linear
    from kopt.passes.fuse_activation_quant import FuseActivationQuant

    fp8 = Fp8Linear(config)
    producers = [] if Granularity(config.granularity) is not Granularity.ROW else [FuseActivationQuant()]
    passes = [p for p in passes if p.name not in {q.name for q in producers}]
    names = [p.name for p in passes]
    if fp8.name in names:
        at = names.index(fp8.name)
        return [*passes[:at], fp8, *producers, *passes[at + 1:]]
    if "sibling-merge" in names:
        at = names.index("sibling-merge") + 1
    else:
        later = [names.index(n) for n in ("bias-absorption", "staging") if n in names]
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
