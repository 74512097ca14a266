"""The base of the passes that change numerics by quantizing to FP8 (``fp8-linear``, ``fp8-attention``).

Each is configured by a :class:`kopt.fp8.Fp8Config`, and its contract is that config's quality gate:
the rewritten model must keep the gate's cosine and SQNR against bf16, which ``verify=True`` checks.
"""

from __future__ import annotations

from typing import ClassVar

from kopt.fp8.config import Fp8Config
from kopt.passes.base import Contract, Pass


class Fp8Pass(Pass):
    """A pass configured by an :class:`Fp8Config` (``default_config`` when none is given)."""

    default_config: ClassVar[Fp8Config] = Fp8Config()

    def __init__(self, config: Fp8Config | None = None) -> None:
        self.config = config or self.default_config

    @property
    def contract(self) -> Contract:  # type: ignore[override]
        gate = self.config.gate
        return Contract.quality(gate.min_cosine, gate.max_rel_err)
