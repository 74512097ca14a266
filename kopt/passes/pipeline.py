"""The pass order: one line per pass, with the reason it sits where it does.

``passes="auto"`` runs :func:`default_pipeline`; a list mixes names from :func:`available_passes`
and :class:`~kopt.passes.base.Pass` objects; ``[]`` captures and lowers only.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    from kopt.passes.fuse_adaln import FuseAdaLN
    from kopt.passes.fuse_gated_residual import FuseGatedResidual
    from kopt.passes.fuse_qk_norm_rope import FuseQKNormRope

    # in this order: fuse-gated-residual consumes fuse-adaln's ops; codegen-fuse last, so it only
    # generates kernels for the elementwise regions the hand-written kernels left
    return [FuseAdaLN(), FuseGatedResidual(), FuseQKNormRope(), CodegenFuse()]


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
