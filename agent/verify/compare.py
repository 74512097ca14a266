"""Does one candidate output meet the contract? Judged against the region's exact (float64) values.

Three tensors per output: the candidate's ``C``, the original region's ``N`` (its own dtypes) and
``R``, the region recomputed in float64 (:mod:`kopt.agent.interpret`). The rules, and why each is
valid:

* **exact** contracts compare ``C`` with ``N`` bit for bit (NaN where ``N`` has NaN): the promise.
* **Non-finite values.** Where both ``R`` and ``N`` are NaN/inf the true result is undefined or
  overflows, so ``C`` must be non-finite too (a finite value there is NaN masking); where both are
  finite, ``C`` must be finite (a NaN/inf there is invented). Where only ``N`` overflowed, ``C`` may
  do either: avoiding the original's overflow is an improvement, not a violation.
* **Norm error.** ``e_C = ||C - R|| / ||R||`` over the finite positions must be at most
  ``rel_tol + e_N``, where ``e_N`` is the original's own error against ``R``. The contract bounds how
  far the candidate may drift from the original; measuring both against the exact value lets a
  candidate be *more* accurate than the original (a float32 accumulation of a bfloat16 region) and
  rejects one that loses precision the original had (float16 arithmetic under a float32 contract).
  Relative error makes "return zeros" cost 1.0 and identity cost far more than any tolerance.
* **Cosine** (quality contracts): ``cos(C, R) >= min_cosine``, as the FP8 quality gate does.
* **Per row.** Each row (the last dim) must meet ``row_slack`` times the same bound on its own,
  measured against ``max(||R_row||, sqrt(n) * rms(R))`` so that a row whose true values are all
  near zero is not held to a relative bound it cannot meet. A norm over the whole output averages
  one wrong row among many into a small number; under a loose (quality) contract that small number
  can pass, a wrong row cannot.
* **Per element.** ``|C_i - R_i| <= slack * (rel_tol + e_N) * (|R_i| + rms_row(R))``: each element
  against its own magnitude plus its row's RMS. Honest error is spread over all elements (rounding,
  quantization noise); a missed tail or a masking bug concentrates it in a few, which this catches
  one element at a time, while the ``|R_i|`` term keeps honest rounding of large elements inside.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kopt.passes.base import Contract, ContractKind


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The outcome for one output, with the numbers behind it."""

    ok: bool
    detail: str
    rel_err: float = 0.0
    bound: float = 0.0
    original_err: float = 0.0
    cosine: float = 1.0
    worst_element: float = 0.0  # the largest |C_i - R_i| / allowance_i (<= 1 passes)

    def numbers(self) -> tuple[tuple[str, float], ...]:
        return (("rel_err", self.rel_err), ("bound", self.bound), ("original_err", self.original_err),
                ("cosine", self.cosine), ("worst_element", self.worst_element))


def _same_bits(c: torch.Tensor, n: torch.Tensor) -> bool:
    if c.is_floating_point():
        nan_c, nan_n = torch.isnan(c), torch.isnan(n)
        return bool(torch.equal(nan_c, nan_n) and torch.equal(c[~nan_c], n[~nan_n]))
    return bool(torch.equal(c, n))


def _rms_rows(values: torch.Tensor) -> torch.Tensor:
    """The RMS of each row (last dim), broadcast back to every element of the row."""
    if values.dim() == 0:
        return values.abs()
    return values.pow(2).mean(dim=-1, keepdim=True).sqrt().expand_as(values)


def _row_errors(c: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Per row: ||C - R|| / max(||R||, sqrt(n) * rms(R over everything))."""
    if r.dim() == 0:
        c, r = c.reshape(1), r.reshape(1)
    floor = r.pow(2).mean().sqrt() * (r.shape[-1] ** 0.5)
    return (c - r).norm(dim=-1) / r.norm(dim=-1).clamp_min(floor.item()).clamp_min(1e-300)


def compare(candidate: torch.Tensor, original: torch.Tensor, exact: torch.Tensor, contract: Contract,
            slack: float, row_slack: float = 2.0) -> Comparison:
    """Check one output (same shape and dtype assumed; the structural checks come first)."""
    if contract.kind is ContractKind.EXACT or not (original.is_floating_point() or original.is_complex()):
        ok = _same_bits(candidate, original)
        return Comparison(ok, "bit-identical to the original" if ok else "not bit-identical to the original")
    if original.is_complex():
        candidate, original, exact = (torch.view_as_real(t) for t in (candidate, original, exact))
    c, n, r = candidate.double(), original.double(), exact.double()
    fin_c, fin_n, fin_r = torch.isfinite(c), torch.isfinite(n), torch.isfinite(r)
    masked = int((~fin_r & ~fin_n & fin_c).sum())
    if masked:
        return Comparison(False, f"{masked} finite values where the original is NaN/inf (NaN masking)", math.inf)
    invented = int((fin_r & fin_n & ~fin_c).sum())
    if invented:
        return Comparison(False, f"{invented} NaN/inf values where the original is finite", math.inf)
    both = fin_r & fin_n
    zero = torch.zeros((), dtype=torch.float64)
    r_m, n_m, c_m = (torch.where(both, t, zero) for t in (r, n, c))
    norm = r_m.norm().item()
    err_c, err_n = (c_m - r_m).norm().item(), (n_m - r_m).norm().item()
    rel_c = err_c / norm if norm > 0 else (0.0 if err_c == 0 else math.inf)
    rel_n = err_n / norm if norm > 0 else 0.0
    bound = contract.rel_tol + rel_n
    cosine = (c_m.flatten() @ r_m.flatten()).item() / max(c_m.norm().item() * norm, 1e-300) if norm > 0 else 1.0
    allowance = slack * bound * (r_m.abs() + _rms_rows(r_m))
    excess = (c_m - r_m).abs() - allowance
    worst = ((c_m - r_m).abs() / allowance.clamp_min(1e-300)).max().item() if c_m.numel() else 0.0
    numbers = dict(rel_err=rel_c, bound=bound, original_err=rel_n, cosine=cosine, worst_element=worst)
    if rel_c > bound:
        return Comparison(False, f"relative error {rel_c:.3g} > bound {bound:.3g} "
                                 f"(rel_tol {contract.rel_tol:g} + the original's own {rel_n:.3g})", **numbers)
    if contract.kind is ContractKind.QUALITY and cosine < contract.min_cosine:
        return Comparison(False, f"cosine {cosine:.6f} < {contract.min_cosine:g}", **numbers)
    rows = _row_errors(c_m, r_m)
    worst_row = rows.max().item() if rows.numel() else 0.0
    if norm > 0 and worst_row > row_slack * bound:
        index = int(rows.flatten().argmax())
        return Comparison(False, f"row {index} has relative error {worst_row:.3g} > {row_slack:g} x {bound:.3g}: a "
                                 "wrong or missing row", **numbers)
    bad = int((excess > 0).sum())
    if bad:
        where = torch.nonzero(excess > 0)[0].tolist()
        return Comparison(False, f"{bad} elements outside their per-element bound (first at {where}, "
                                 f"{worst:.3g}x the allowance): a partial or localized error", **numbers)
    return Comparison(True, f"relative error {rel_c:.3g} <= {bound:.3g}", **numbers)
