"""End-to-end time of the whole forward compiled regionally, as the user runs it: the agent's GPU clock.

:class:`kopt.agent.bench.WallClock` times the captured graphs of a whole-model capture: every
candidate set means lowering the whole model again (55 s on LTX-Video, 259 s with GEMM autotuning),
so a 20-minute run measured three candidates. :class:`RegionalClock` times what
``kopt.compile(model, regional=True)`` gives the user instead: each side of an A/B is that compile
of the model, with the candidate set applied by the passes exactly where the knowledge base's
findings apply later (:mod:`kopt.agent.auto`: region candidates before ``staging``, a pipeline
choice by the signature of the block graph before passes), and every sample is one call of the
model's forward, replayed from one CUDA graph when CUDA graphs are on (:mod:`kopt.forward_replay`),
the code between blocks included. A side lowers one graph per block class: seconds, not minutes.

Why two sides can share one module: a regional compile sets each block's ``_compiled_call_impl``
(with ``between_blocks="outer"`` the model's too, and the trunk's opaque ``forward``: :mod:`kopt.between_blocks`);
each side keeps the ones it set and puts them back before each of its calls (:meth:`_Side.activate`),
and each has dynamo cache state of its own (:func:`kopt.dynamo_cache.compile_blocks_isolated`).
Sides never change the module's weights: derived constants are copies (``share_weights=False``),
nothing is released (``release_weights=False``), and weights are not watched (``on_weight_change=
"ignore"``: the A/B changes no weight, and a per-call checksum would only add the same work to both
sides). Kopt's lowering check is off: the loop checks every candidate's outputs itself, on each
block graph (:func:`kopt.agent.bench.quality`) and on the model's output (:meth:`RegionalClock.model_checks`).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kopt.agent.candidate import Candidate, CandidateKind
from kopt.agent.graphs import call
from kopt.passes.base import Contract

log = logging.getLogger("kopt")


def fresh_inputs(inputs: Sequence[Any] | Mapping[str, Any], seed: int) -> Sequence[Any] | Mapping[str, Any]:
    """The model's inputs with new values for its floating tensors of more than one element (same
    shape, mean and spread: :func:`kopt.agent.bench.fresh_args`); a timestep or guidance scalar and
    every other argument stay as given, so the model is checked where it is used."""
    from kopt.agent.bench import fresh_args

    if isinstance(inputs, Mapping):
        return dict(zip(inputs, fresh_args(list(inputs.values()), seed), strict=True))
    return fresh_args(list(inputs), seed)


def side_passes(chosen: Mapping[str, Candidate]) -> list[Any]:
    """``passes="auto"`` with ``chosen`` applied: pipeline choices switched per block graph
    (:func:`kopt.agent.auto_pipeline.switched`), region candidates right before ``staging``."""
    from kopt.agent.apply import ApplyCandidates
    from kopt.agent.auto_pipeline import switched
    from kopt.passes.pipeline import default_pipeline

    passes: list[Any] = list(default_pipeline())
    choices = {s: (c, None) for s, c in chosen.items() if c.kind is CandidateKind.PASS_CHOICE}
    if choices:
        passes = switched(passes, choices, None)
    regions = {s: c for s, c in chosen.items() if c.kind is not CandidateKind.PASS_CHOICE}
    if regions:
        names = [p.name for p in passes]
        at = names.index("staging") if "staging" in names else len(passes)
        passes.insert(at, ApplyCandidates(regions))
    return passes


def side_problem(report: Any) -> str:
    """Why a compiled side does not run what it was built to (a pass skipped after an error, a graph
    that fell back to its original), or empty. kopt's compile never breaks a user's model over such
    a failure; the agent must not time it as if the candidate ran."""
    if report.recompile_limit:  # dynamo gave up on a frame: some of the side's code runs eagerly
        return f"runs code eagerly: {report.recompile_limit}"
    for graph in report.graphs:
        if graph.fallback:
            return f"runs block graph {graph.index} as captured: {graph.fallback}"
        for record in graph.passes:
            if record.status.startswith("skipped"):
                return f"skipped pass {record.name!r} on block graph {graph.index}: {record.status}"
    return ""


def _room_for_every_side(between_blocks: str) -> Any:
    """Where sides share a frame's dynamo cache, room for an entry per side.

    With ``between_blocks="outer"`` dynamo compiles the model's own ``forward`` below a graph break (with
    ``"compiled"``, below any break the model's own code makes): without ``isolate_recompiles`` (torch <
    2.13) that frame's cache is its code's, shared by every side of the run (each entry guarded by its
    backend), and the 9th side would run it eagerly."""
    import contextlib

    from kopt.dynamo_cache import ISOLATES_RECOMPILES

    if between_blocks not in ("outer", "compiled") or ISOLATES_RECOMPILES:
        return contextlib.nullcontext()
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    return config.patch(**{name: max(getattr(config, name), 256)})


@dataclasses.dataclass
class _Side:
    """One compile of the model with one candidate set, and the compiled entry points it set."""

    compiled: Any
    calls: dict[torch.nn.Module, Any]  # kopt.between_blocks.compiled_state

    def activate(self) -> None:
        from kopt.between_blocks import set_state

        set_state(self.calls)

    def dispose(self) -> None:
        self.compiled._kopt_backend.dispose()
        self.compiled._replay = None  # its recording and memory pool
        self.calls.clear()


@dataclasses.dataclass
class RegionalClock:
    """Real time per call of ``model``'s forward compiled regionally with a candidate set (module docstring).

    ``lower``: ``"inductor"`` (what a GPU number must use) or ``"eager"`` (CPU tests); ``replay``:
    CUDA-graph replay of the whole forward (default: on a GPU with Inductor); ``between_blocks``: as
    ``kopt.compile``'s (``"linears"``: the large linears between the blocks are graphs too)."""

    model: torch.nn.Module
    inputs: Sequence[Any] | Mapping[str, Any]
    lower: str = "inductor"
    replay: bool | None = None
    name: str = "wall-regional"
    between_blocks: str = "eager"

    def __post_init__(self) -> None:
        if self.lower not in ("eager", "inductor"):
            raise ValueError(f"lower must be 'eager' or 'inductor', got {self.lower!r}")
        values = self.inputs.values() if isinstance(self.inputs, Mapping) else self.inputs
        device = next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))
        self.device = device
        if self.replay is None:
            self.replay = device.type == "cuda" and self.lower == "inductor"
        elif self.replay and device.type != "cuda":
            raise ValueError("replay=True needs inputs on a CUDA device")
        suffix = "-inductor-graphs" if self.replay else f"-{self.lower}"
        if self.name == "wall-regional":
            self.name += suffix
        self._sides: dict[tuple[str, ...], _Side] = {}
        self.unreplayed: dict[tuple[str, ...], str] = {}  # key -> why that side runs as plain calls
        self.build_seconds: list[float] = []  # compile + warm-up + recording, per side built

    @staticmethod
    def _key(chosen: Mapping[str, Candidate]) -> tuple[str, ...]:
        return tuple(sorted(c.content_hash for c in chosen.values()))

    def _side(self, chosen: Mapping[str, Candidate]) -> _Side:
        key = self._key(chosen)
        if key in self._sides:
            self._sides[key] = self._sides.pop(key)  # most recently used last
            return self._sides[key]
        while len(self._sides) >= 2:  # an A/B needs two; the baseline, timed in every pair, stays
            evicted = self._sides.pop(next(iter(self._sides)))
            evicted.dispose()
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        self._sides[key] = side = self._build(chosen, key)
        return side

    def _build(self, chosen: Mapping[str, Candidate], key: tuple[str, ...]) -> _Side:
        import kopt
        from kopt.between_blocks import compiled_state
        from kopt.regional import regional_modules

        began = time.perf_counter()
        compiled = kopt.compile(self.model, passes=side_passes(chosen), regional=True, lower=self.lower,
                                cuda_graphs=self.replay, check_lowering=False, kb=False, release_weights=False,
                                share_weights=False, on_weight_change="ignore", progress=False,
                                between_blocks=self.between_blocks)
        side = _Side(compiled, compiled_state(regional_modules(self.model, self.between_blocks)))
        try:
            with torch.no_grad(), _room_for_every_side(self.between_blocks):
                call(compiled, self.inputs)  # compiles the blocks
                problem = side_problem(compiled.kopt_report)
                if problem:  # timing it would time the baseline, or less: the evaluation fails with the reason
                    raise RuntimeError(f"the side compiled with this candidate set {problem}")
                for _ in range(3):  # warm up, record, replay (kopt.forward_replay)
                    call(compiled, self.inputs)
                for _ in range(3):  # a failed first recording retries (kopt.cuda_graphs): not in a timed call
                    stats = compiled._replay.stats if self.replay and compiled._replay is not None else None
                    if stats is None or stats.replays > 0 or stats.disabled is not None:
                        break
                    call(compiled, self.inputs)
        except BaseException:  # its memory goes now (an out-of-memory side must not starve the next one)
            side.dispose()
            del side, compiled
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            raise
        if self.replay:
            replay = compiled._replay
            disabled = replay.stats.disabled if replay is not None else "no whole-forward replay"
            if disabled is not None:
                self.unreplayed[key] = disabled
                log.warning("agent: timing one side without whole-forward replay: %s", disabled)
        self.build_seconds.append(time.perf_counter() - began)
        log.info("agent: compiled one side regionally in %.1f s", self.build_seconds[-1])
        return side

    def keep_only(self, chosen: Mapping[str, Candidate]) -> None:
        """Dispose every side but ``chosen``'s (the baseline of the next A/B): a side of a candidate
        already judged is never timed again, and on a large model (FLUX.2: 64 GB of weights, ~32 GB
        per FP8 side) its memory is what the verifier's child and the micro step need next."""
        key = self._key(chosen)
        spare = [k for k in self._sides if k != key]
        for k in spare:
            self._sides.pop(k).dispose()
        if spare:
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def model_checks(self, chosen: Mapping[str, Candidate], contract: Contract, seed: int) -> list[dict]:
        """The model's output with ``chosen`` against its higher-precision reference, on fresh inputs
        (:func:`fresh_inputs`), within ``contract`` (eager bf16's own error is the budget's base):
        what the user's output does once every block runs the candidates, which a check of one
        block's graph on random arguments does not show (errors compound over the blocks)."""
        from kopt.between_blocks import run_as_written
        from kopt.reference import reference_forward
        from kopt.regional import regional_modules
        from kopt.verify import compare

        fresh = fresh_inputs(self.inputs, seed)
        side = self._side(chosen)
        side.activate()
        blocks = regional_modules(self.model, self.between_blocks)
        with torch.no_grad():
            got = call(side.compiled, fresh)
            run_as_written(blocks)  # the module as the user wrote it
            try:
                eager = call(self.model, fresh)
                if isinstance(fresh, Mapping):
                    reference = reference_forward(self.model, **fresh)
                else:
                    reference = reference_forward(self.model, *fresh)
            finally:
                side.activate()
        return [{"graph": "model", "output": c.output, "ok": c.ok, "rel_err": c.rel_err, "cosine": c.cosine,
                 "verdict": c.verdict} for c in compare(got, eager, contract, reference=reference)]

    def report(self, chosen: Mapping[str, Candidate]) -> Any:
        """The kopt report of the side compiled with ``chosen`` (built if needed): which rewrites fired."""
        return self._side(chosen).compiled.kopt_report

    def time_once(self, chosen: Mapping[str, Candidate]) -> float:
        side = self._side(chosen)
        side.activate()
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        with torch.no_grad():
            sync()
            start = time.perf_counter()
            call(side.compiled, self.inputs)
            sync()
        return time.perf_counter() - start

    def samples(self, chosen: Mapping[str, Candidate], count: int, stream: int) -> list[float]:
        return [self.time_once(chosen) for _ in range(count)]

    def close(self) -> None:
        """Drop every side and give the model back with its blocks uncompiled."""
        from kopt.regional import uncompile_blocks

        for side in self._sides.values():
            side.dispose()
        self._sides.clear()
        uncompile_blocks(self.model)
        gc.collect()
