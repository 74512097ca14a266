"""The quality gate: a quantized model's output against a higher-precision reference, eager beside.

Three numbers, all in float64: relative error ‖out − ref‖ / ‖ref‖, cosine similarity, and SQNR in
dB (10·log10 of signal over error energy, i.e. −20·log10 of the relative error). Both cosine and
SQNR are gated because cosine ignores a global scale error and SQNR does not, while SQNR alone says
little about direction.

What the gate compares (:func:`judge`, and ``verify=True`` through the ``quality`` contract of the
FP8 passes): the FP8 output and eager bf16's, each against a higher-precision reference of the same
weights (:mod:`kopt.reference`). The gate's thresholds are the error FP8 may *add* to eager's: the
FP8 output passes when its relative error is at most eager's plus ``10**(-min_sqnr_db/20)`` and its
angle to the reference at most eager's plus ``acos(min_cosine)`` (:class:`kopt.verify.ContractRule`
says why that is what "within the gate of eager" means, by the triangle inequality). So an FP8
model of a model whose bf16 output is itself far from the reference (FLUX.1: cos 0.999 in bf16) is
not failed for bf16's error, and an FP8 output is never passed for being close to a poor eager.
:func:`measure` gives the three numbers for any pair of outputs.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kopt.fp8.config import QualityGate
from kopt.passes.base import Contract
from kopt.verify import ContractRule, Distance, distance


@dataclasses.dataclass(frozen=True)
class Quality:
    rel_err: float
    cosine: float
    sqnr_db: float
    gate: QualityGate

    @property
    def passed(self) -> bool:
        return self.cosine >= self.gate.min_cosine and self.sqnr_db >= self.gate.min_sqnr_db

    def __str__(self) -> str:
        verdict = "pass" if self.passed else "FAIL"
        return (f"rel_err {self.rel_err:.3e}, cosine {self.cosine:.6f} (≥ {self.gate.min_cosine}), "
                f"SQNR {self.sqnr_db:.1f} dB (≥ {self.gate.min_sqnr_db}): {verdict}")


def measure(candidate: torch.Tensor, reference: torch.Tensor, gate: QualityGate | None = None) -> Quality:
    """Quality of ``candidate`` against ``reference`` (any float dtypes, same shape)."""
    if candidate.shape != reference.shape:
        raise ValueError(f"shapes differ: {tuple(candidate.shape)} vs {tuple(reference.shape)}")
    if not torch.isfinite(candidate.detach()).all():
        return Quality(math.inf, -1.0, -math.inf, gate or QualityGate())
    measured = distance(candidate, reference)  # float64, in chunks on the device
    rel = measured.rel_err
    sqnr = math.inf if rel == 0 else -20 * math.log10(rel)
    return Quality(rel, measured.cosine, sqnr, gate or QualityGate())


@dataclasses.dataclass(frozen=True)
class GateVerdict:
    """An FP8 output judged against the reference with eager beside it (module docstring)."""

    candidate: Quality  # the FP8 output against the reference
    eager: Quality  # eager (bf16) against the reference
    vs_eager: Quality  # the FP8 output against eager
    passed: bool

    def __str__(self) -> str:
        verdict = "pass" if self.passed else "FAIL"
        return (f"vs reference: rel_err {self.candidate.rel_err:.3e}, cosine {self.candidate.cosine:.6f} "
                f"(eager: {self.eager.rel_err:.3e}, {self.eager.cosine:.6f}); vs eager: rel_err "
                f"{self.vs_eager.rel_err:.3e}, cosine {self.vs_eager.cosine:.6f}; gate (cos "
                f"{self.candidate.gate.min_cosine}, {self.candidate.gate.min_sqnr_db} dB) added to eager's: {verdict}")


def judge(candidate: torch.Tensor, eager: torch.Tensor, reference: torch.Tensor,
          gate: QualityGate | None = None) -> GateVerdict:
    """Whether ``candidate`` stays within ``gate`` of ``eager``, both measured against ``reference``."""
    gate = gate or QualityGate()
    mine, base, vs_eager = measure(candidate, reference, gate), measure(eager, reference, gate), measure(
        candidate, eager, gate)
    rule = ContractRule(Contract.quality(gate.min_cosine, gate.max_rel_err))
    finite = math.isfinite(mine.rel_err)
    passed = finite and rule.accepts(Distance(mine.rel_err, mine.cosine), Distance(base.rel_err, base.cosine),
                                     candidate.dtype)
    return GateVerdict(mine, base, vs_eager, passed)
