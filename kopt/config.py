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
    """What a compiled graph does when a weight behind a derived constant changed after compiling
    (a LoRA hot-swap, ``load_state_dict``). Weights no pass transformed are read live: always current."""

    # compute the derived constants (merged, quantized, folded, memoized) again from the new
    # weights, in place, without capturing or lowering again
    RECOMPILE = "recompile"
    RAISE = "raise"  # raise WeightsChangedError; call ``kopt_refresh()`` yourself
    # skip the per-call check. Only for weights that never change: derived constants would go
    # stale while the rest of the graph reads the updated weights (a mix of old and new).
    IGNORE = "ignore"


class WeightCheck(enum.Enum):
    """How a compiled graph notices that a weight behind a derived constant changed (:mod:`kopt.weight_guard`)."""

    # version counter and storage, then a row-wise checksum of each watched weight: sees writes
    # through ``param.data`` too (PEFT's hot-swap); reads the watched weights once per call
    CHECKSUM = "checksum"
    VERSION = "version"  # version counter and storage only: free, but misses writes through ``param.data``


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
        weight_check: how a change of a weight behind a derived constant is noticed.
        mode: ``torch.compile``'s mode (:func:`mode_options`): Inductor options and CUDA graphs.
        share_weights: module weights that a merged constant holds row for row become views of it
            (:mod:`kopt.fx.shared_weights`): one copy of their bytes instead of two.
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
    weight_check: WeightCheck = WeightCheck.CHECKSUM
    mode: str = "default"
    share_weights: bool = True

    @property
    def use_cuda_graphs(self) -> bool:
        """Whether lowered graphs with CUDA inputs are replayed from CUDA graphs: ``cuda_graphs`` if
        given, else what ``mode`` says, else yes for ``lower="inductor"``."""
        if self.cuda_graphs is not None:
            return self.cuda_graphs
        from_mode, _ = mode_options(self.mode)
        return self.lower is Lowering.INDUCTOR if from_mode is None else from_mode

    @property
    def inductor_options(self) -> dict[str, object]:
        """Inductor config patches for lowering (from ``mode``)."""
        return mode_options(self.mode)[1]

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


def mode_options(mode: str) -> tuple[bool | None, dict[str, object]]:
    """``torch.compile``'s ``mode`` as (CUDA graphs on/off/None for kopt's default, Inductor options).

    Inductor's options for the mode are torch's own (``torch._inductor.list_mode_options``:
    ``max-autotune`` tunes GEMM templates and pointwise launch configs) except
    ``triton.cudagraphs``: kopt replays each lowered graph from CUDA graphs itself
    (:mod:`kopt.cuda_graphs`), so a mode that asks for them turns on kopt's ``cuda_graphs``, and
    ``max-autotune-no-cudagraphs`` turns them off. kopt's own kernels tune their launch configs
    in every mode (``KOPT_AUTOTUNE=0`` turns that off).
    """
    from torch._inductor import list_mode_options

    known = list_mode_options()
    if mode not in known:
        raise ValueError(f"mode={mode!r}: expected one of {sorted(known)}")
    inductor = dict(known[mode])
    graphs = inductor.pop("triton.cudagraphs", None)
    if mode == "max-autotune-no-cudagraphs":
        graphs = False
    return graphs, inductor
