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
  ``rel_tol + p * e_N``, where ``e_N`` is the original's own error against ``R`` (taken, element by
  element, at least as large as the result's sensitivity to rounding the inputs once more) and
  ``p`` the precision slack (8). The contract bounds how far the candidate may drift; measuring
  against the exact value lets a candidate be *more* accurate than the original (a float32
  accumulation of a bfloat16 region). The ``p * e_N`` term admits any backward-stable algorithm in
  the inputs' precision, however accurate the original happens to be (the CPU reduces float32 in
  float64; a GPU kernel will not): a stable algorithm errs by about the sensitivity, a sequential
  one (a running sum, Welford updates) by up to sqrt(n) times it, which 8 (16 for one row) covers
  up to n ~ 2000. It admits nothing less precise: float16 arithmetic errs ~8000 times more than
  float32, bfloat16 ~65000 times. Relative error makes "return zeros" cost 1.0.
* **Cosine** (quality contracts): ``cos(C, R) >= min_cosine``, as the FP8 quality gate does.
* **Per row.** Each row (the last dim) must meet ``row`` times the bound on its own, with the
  original's error taken as the larger of its error on that row and overall, measured against
  ``max(||R_row||, sqrt(n) * rms(R))`` so that a row of near-zero true values is not held to a
  relative bound it cannot meet. A norm over the whole output averages one wrong row among many
  into a small number; a wrong row cannot hide here.
* **Per element.** ``|C_i - R_i| <= element * (rel_tol * (|R_i| + S(R)) + p * (|N_i - R_i| +
  S(N - R)))`` where ``S`` is the larger of the row's RMS and the whole output's: each element
  against its own magnitude, its surroundings' magnitude (quantization error scales with the
  operands, not with one output element, which may be near zero by cancellation), and the
  original's own error there (where every implementation is inexact, such as subnormal results).
  Honest error is spread over all elements; a missed tail or a masking bug concentrates it in a
  few, which this catches one element at a time.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kopt.passes.base import Contract, ContractKind


@dataclasses.dataclass(frozen=True)
class Slack:
    """The factors of the rules above (see the module docstring for why each is safe)."""

    precision: float = 8.0  # times the original's own error (or the inputs' rounding sensitivity)
    row: float = 2.0  # times the bound, for one row
    element: float = 4.0  # times the bound, for one element


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


def _rms_rows(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The RMS of each row (last dim) over its ``mask``ed positions, broadcast back to every element."""
    if values.dim() == 0:
        return values.abs()
    count = mask.sum(dim=-1, keepdim=True).clamp_min(1)
    return (values.pow(2).sum(dim=-1, keepdim=True) / count).sqrt().expand_as(values)


def _rms(values: torch.Tensor, mask: torch.Tensor) -> float:
    return (values.pow(2).sum() / mask.sum().clamp_min(1)).sqrt().item()


def _row_norms(values: torch.Tensor, floor: float) -> torch.Tensor:
    values = values.reshape(1) if values.dim() == 0 else values
    return values.norm(dim=-1).clamp_min(floor).clamp_min(1e-300)


def compare(candidate: torch.Tensor, original: torch.Tensor, exact: torch.Tensor, contract: Contract,
            slack: Slack = Slack(), sensitivity: torch.Tensor | None = None) -> Comparison:
    """Check one output (same shape and dtype assumed; the structural checks come first).
    ``sensitivity`` is how far the exact result moves when the inputs are rounded once more
    (:class:`kopt.agent.verify.reference.Reference`); None counts as zero."""
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
    own = (n_m - r_m).abs()  # the original's error, at least the inputs' own rounding sensitivity
    if sensitivity is not None:
        own = torch.maximum(own, torch.where(both & torch.isfinite(sensitivity), sensitivity.double(), zero))
    norm = r_m.norm().item()
    err_c, err_n = (c_m - r_m).norm().item(), own.norm().item()
    rel_c = err_c / norm if norm > 0 else (0.0 if err_c == 0 else math.inf)
    rel_n = err_n / norm if norm > 0 else 0.0
    bound = contract.rel_tol + slack.precision * rel_n
    cosine = (c_m.flatten() @ r_m.flatten()).item() / max(c_m.norm().item() * norm, 1e-300) if norm > 0 else 1.0
    allowance = slack.element * (contract.rel_tol * (r_m.abs() + _rms_rows(r_m, both).clamp_min(_rms(r_m, both)))
                                 + slack.precision * (own + _rms_rows(own, both).clamp_min(_rms(own, both))))
    excess = (c_m - r_m).abs() - allowance
    worst = ((c_m - r_m).abs() / allowance.clamp_min(1e-300)).max().item() if c_m.numel() else 0.0
    numbers = dict(rel_err=rel_c, bound=bound, original_err=rel_n, cosine=cosine, worst_element=worst)
    if rel_c > bound:
        return Comparison(False, f"relative error {rel_c:.3g} > bound {bound:.3g} (rel_tol {contract.rel_tol:g} + "
                                 f"{slack.precision:g} x the original's own {rel_n:.3g})", **numbers)
    if contract.kind is ContractKind.QUALITY and cosine < contract.min_cosine:
        return Comparison(False, f"cosine {cosine:.6f} < {contract.min_cosine:g}", **numbers)
    if norm > 0:
        floor = _rms(r_m, both) * (r_m.shape[-1] if r_m.dim() else 1) ** 0.5
        denominator = _row_norms(r_m, floor)
        rows_c = _row_norms(c_m - r_m, 0.0) / denominator
        rows_n = (_row_norms(own, 0.0) / denominator).clamp_min(rel_n)
        rows_bound = slack.row * (contract.rel_tol + slack.precision * rows_n)
        over = rows_c / rows_bound
        if over.numel() and over.max().item() > 1:
            index = int(over.flatten().argmax())
            return Comparison(False, f"row {index} has relative error {rows_c.flatten()[index].item():.3g}, "
                                     f"{over.max().item():.3g}x its bound: a wrong or missing row", **numbers)
    bad = int((excess > 0).sum())
    if bad:
        where = torch.nonzero(excess > 0)[0].tolist()
        return Comparison(False, f"{bad} elements outside their per-element bound (first at {where}, "
                                 f"{worst:.3g}x the allowance): a partial or localized error", **numbers)
    return Comparison(True, f"relative error {rel_c:.3g} <= {bound:.3g}", **numbers)
