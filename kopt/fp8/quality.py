"""The quality gate: a quantized model's output against its bf16 output, on real inputs.

Three numbers, all in float64: relative error ‖out − ref‖ / ‖ref‖, cosine similarity, and SQNR in
dB (10·log10 of signal over error energy, i.e. −20·log10 of the relative error). A model passes
when cosine and SQNR meet :class:`~kopt.fp8.config.QualityGate`; both are checked because cosine
ignores a global scale error and SQNR does not, while SQNR alone says little about direction.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kopt.fp8.config import QualityGate


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
    c, r = candidate.detach().double().flatten(), reference.detach().double().flatten()
    if not torch.isfinite(c).all():
        return Quality(math.inf, -1.0, -math.inf, gate or QualityGate())
    error, signal = (c - r).norm().item(), r.norm().item()
    rel = error / signal if signal > 0 else (0.0 if error == 0 else math.inf)
    cosine = torch.nn.functional.cosine_similarity(c, r, dim=0).item() if signal > 0 else float(error == 0)
    sqnr = math.inf if rel == 0 else -20 * math.log10(rel)
    return Quality(rel, cosine, sqnr, gate or QualityGate())
