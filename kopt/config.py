"""Typed options for :func:`kopt.compile`; no bare strings where a name can be mistyped silently."""

from __future__ import annotations

import dataclasses
import enum
import os
from pathlib import Path


class Lowering(enum.Enum):
    """What runs the rewritten graph."""

    INDUCTOR = "inductor"  # torch.compile's own code generator (default: fuses what kopt leaves)
    EAGER = "eager"  # run the rewritten FX graph op by op (fast to compile; tests, debugging)


class WeightChange(enum.Enum):
    """What a compiled module does when a frozen weight changed after compiling (LoRA swap, load)."""

    RECOMPILE = "recompile"  # capture and rewrite again with the new weights (correct, slow once)
    RAISE = "raise"  # raise WeightsChangedError; call ``kopt_refresh()`` yourself
    # skip the per-call check (saves ~1 µs per weight per call). Only for weights that never change:
    # constants derived at compile time (concatenated, quantized) would go stale while the rest of
    # the graph reads the updated tensors, so a change gives a mix of old and new weights.
    IGNORE = "ignore"


class Role(enum.Enum):
    """Binding time of a graph input: when its value can change."""

    CONSTANT = "constant"  # parameters, buffers: fixed after compiling
    STEP_INVARIANT = "step-invariant"  # timestep, guidance, position ids: same for both CFG calls
    PER_CALL = "per-call"  # latents, prompt embeddings


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """Everything :func:`kopt.compile` and the ``kopt`` backend need, resolved once.

    Attributes:
        lower: what runs the rewritten graph.
        verify: on the first call run the original and the rewritten graph on the same inputs,
            check every output against the passes' contracts, fall back to the original on a
            violation.
        strict: a pass that raises (or a verification failure) raises instead of being skipped.
        roles: explicit binding time per forward argument name; others are inferred.
        on_weight_change: policy when frozen weights change after compiling.
        trace_dir: where to write each pass's graph before/after (``KOPT_DEBUG=1`` sets ``kopt_debug``).
        fuel: apply only the first N rewrites (``KOPT_FUEL``), to bisect a numerics bug to one rewrite.
        memo_entries: how many step-invariant results (one per distinct timestep/guidance value) to
            keep; 2 covers a CFG pair plus the step before.
        cuda_graphs: replay the lowered graph from CUDA graphs (:mod:`kopt.cuda_graphs`) when its
            inputs are CUDA tensors; None (default) means yes for ``lower="inductor"``.
        progress: show each step of a compile on stderr (:mod:`kopt.progress`): True, False, or None
            (default: a status line when stderr is a terminal).
        check_lowering: on the first call, check the lowered graph's outputs against a
            higher-precision reference (:mod:`kopt.checks`) and run the graph as FX if it fails;
            None (default) means yes for ``lower="inductor"``.
    """

    lower: Lowering = Lowering.INDUCTOR
    verify: bool = False
    strict: bool = False
    roles: tuple[tuple[str, Role], ...] = ()
    on_weight_change: WeightChange = WeightChange.RECOMPILE
    trace_dir: Path | None = None
    fuel: int | None = None
    memo_entries: int = 2
    cuda_graphs: bool | None = None
    progress: bool | None = None
    check_lowering: bool | None = None

    @property
    def use_cuda_graphs(self) -> bool:
        """Whether lowered graphs with CUDA inputs are replayed from CUDA graphs."""
        return self.lower is Lowering.INDUCTOR if self.cuda_graphs is None else self.cuda_graphs

    @property
    def checks_lowering(self) -> bool:
        """Whether the lowered graph is checked against the reference on its first call."""
        if self.lower is Lowering.EAGER:
            return False  # the graph runs as FX: the op-by-op run is the lowering
        return self.check_lowering is not False

    @staticmethod
    def from_environment(**overrides: object) -> CompileOptions:
        """Defaults, then ``KOPT_DEBUG`` / ``KOPT_FUEL`` from the environment, then ``overrides``."""
        values: dict[str, object] = {}
        if os.environ.get("KOPT_DEBUG", "") not in ("", "0"):
            debug = os.environ["KOPT_DEBUG"]
            values["trace_dir"] = Path("kopt_debug" if debug == "1" else debug)
        if os.environ.get("KOPT_FUEL"):
            values["fuel"] = int(os.environ["KOPT_FUEL"])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return CompileOptions(**values)  # type: ignore[arg-type]

    def role_for(self, name: str) -> Role | None:
        return dict(self.roles).get(name)
