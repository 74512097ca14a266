"""Differential check of a rewritten graph against the original on the same inputs.

Outputs are compared per tensor in float64: an ``exact`` contract demands bit equality (NaN where
the reference has NaN); ``tolerance`` and ``quality`` demand relative error ``||out - ref|| /
||ref||`` within the stated bound (and a cosine floor for ``quality``), and never a NaN or Inf
that the reference does not have. Relative error, not absolute, so that a graph returning zeros
fails (its error is 1).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.utils._pytree as pytree

from kopt.passes.base import Contract, ContractKind


@dataclasses.dataclass(frozen=True)
class OutputCheck:
    output: int
    rel_err: float
    cosine: float
    ok: bool
    verdict: str


def relative_error(candidate: torch.Tensor, reference: torch.Tensor) -> float:
    """``||candidate - reference|| / ||reference||`` in float64 (complex handled as pairs)."""
    c, r = _as_real64(candidate), _as_real64(reference)
    denominator = r.norm().item()
    numerator = (c - r).norm().item()
    if denominator == 0.0:
        return 0.0 if numerator == 0.0 else math.inf
    return numerator / denominator


def cosine_similarity(candidate: torch.Tensor, reference: torch.Tensor) -> float:
    c, r = _as_real64(candidate).flatten(), _as_real64(reference).flatten()
    denominator = (c.norm() * r.norm()).item()
    if denominator == 0.0:
        return 1.0 if torch.equal(c, r) else 0.0
    return (c @ r).item() / denominator


def _as_real64(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    return tensor.to(device="cpu", dtype=torch.float64)


def _check(index: int, candidate: Any, reference: Any, contract: Contract) -> OutputCheck:
    if not isinstance(reference, torch.Tensor):
        ok = candidate == reference
        return OutputCheck(index, 0.0, 1.0, ok, "equal" if ok else f"{candidate!r} != {reference!r}")
    if not isinstance(candidate, torch.Tensor) or candidate.shape != reference.shape:
        shape = getattr(candidate, "shape", type(candidate).__name__)
        return OutputCheck(index, math.inf, 0.0, False, f"shape {shape} != {tuple(reference.shape)}")
    if candidate.dtype != reference.dtype:
        return OutputCheck(index, math.inf, 0.0, False, f"dtype {candidate.dtype} != {reference.dtype}")
    if not reference.is_floating_point() and not reference.is_complex():
        ok = torch.equal(candidate.cpu(), reference.cpu())
        return OutputCheck(index, 0.0 if ok else math.inf, 1.0, ok, "equal" if ok else "integer output differs")
    ref_bad, cand_bad = ~torch.isfinite(reference), ~torch.isfinite(candidate)
    if (cand_bad & ~ref_bad).any():
        return OutputCheck(index, math.inf, 0.0, False, "NaN/Inf where the original is finite")
    finite = ~ref_bad
    c, r = candidate[finite], reference[finite]
    rel, cos = relative_error(c, r), cosine_similarity(c, r)
    if contract.kind is ContractKind.EXACT:
        ok = torch.equal(c, r)
        return OutputCheck(index, rel, cos, ok, "bit-identical" if ok else f"not bit-identical (rel {rel:.2e})")
    ok = rel <= contract.rel_tol and (contract.kind is not ContractKind.QUALITY or cos >= contract.min_cosine)
    verdict = f"rel {rel:.2e} (bound {contract.rel_tol:g}), cos {cos:.6f}" + ("" if ok else " VIOLATION")
    return OutputCheck(index, rel, cos, ok, verdict)


def compare(candidate: Any, reference: Any, contract: Contract) -> list[OutputCheck]:
    """One :class:`OutputCheck` per leaf of the (matching) output structures."""
    cand_leaves, _cand_spec = pytree.tree_flatten(candidate)
    ref_leaves, _ref_spec = pytree.tree_flatten(reference)
    if len(cand_leaves) != len(ref_leaves):
        return [OutputCheck(0, math.inf, 0.0, False,
                            f"{len(cand_leaves)} outputs where the original has {len(ref_leaves)}")]
    return [_check(i, c, r, contract) for i, (c, r) in enumerate(zip(cand_leaves, ref_leaves, strict=True))]
