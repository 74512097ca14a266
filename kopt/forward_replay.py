"""Replay a module's whole forward from one CUDA graph: every compiled block and the code between them.

Regional compilation (:mod:`kopt.regional`) compiles one instance of each repeated block and runs
the code between blocks eagerly. A block's compiled graph cannot usefully replay a CUDA graph of
its own: every block calls it with other weights, so it would need one recording per block. So
:class:`ForwardReplay` records the module's whole forward instead, once per call signature, through
:class:`~kopt.cuda_graphs.CudaGraphRunner`: the call's tensors are copied into the recorded input
buffers, one launch replays every kernel of every block, and the outputs are copied out.

A replay runs none of the Python that a plain call runs: neither dynamo's guards nor the weight
checks of each block's compiled graph. What stands in for them, before every replay:

* **the call**: tensor arguments must have the recorded shapes, dtypes and devices, and every
  other argument the recorded value (plain values, and lists, tuples and dicts of them; anything
  else runs plainly), with the same grad and inference modes. That is what an inference forward's
  dynamo guards depend on;
* **weights given new storage** (``param.data = new``, ``load_state_dict(assign=True)``): a replay
  reads each parameter and buffer where it was recorded, so their storages are compared with the
  recorded ones. In-place writes need nothing: the replay reads the bytes as they are;
* **weights behind derived constants** (a block's merged Q/K/V, its FP8 copy): the weights every
  block's :class:`~kopt.weight_guard.WeightGuard` watches are watched by one guard here, one
  checksum launch for all of them, running beside the replay (as each block's own guard does);
* **kopt_refresh()**: every recording is dropped. A new recording (a new call signature, which
  may compile new graphs) watches the weights of every compiled graph from then on.

On any change the replay's result is discarded and the call runs plainly, where each block's own
guard sees the change and derives its constants again; the recordings are dropped and the next
calls record anew (weight changes are rare: a LoRA swap, not every step).

A forward that cannot be recorded (an op that copies a host value to the GPU, or one that syncs)
runs plainly from then on, and :attr:`ForwardReplay.stats` says why; regional compilation then
lets each block's compiled graph replay a recording of its own, one per block (piecewise).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from kopt.config import WeightCheck
from kopt.cuda_graphs import CudaGraphRunner, CudaGraphStats
from kopt.weight_guard import WeightGuard


def fixed_key(value: Any) -> Any:
    """A hashable key for a non-tensor argument that is part of a recorded call, or TypeError if
    ``value`` holds something whose value a key cannot stand for (a tensor in a list, an object)."""
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return (type(value).__name__, value)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(fixed_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((fixed_key(k), fixed_key(v)) for k, v in value.items()))
    raise TypeError(f"a {type(value).__name__} argument (only tensors and plain values are replayed)")


class ReplayGuard:
    """What must hold for a recorded forward to compute what a plain call would (module docstring)."""

    def __init__(self, module: Callable[..., Any], guards: Iterable[WeightGuard], check: WeightCheck | None) -> None:
        self.tensors = [*module.parameters(), *module.buffers()] if isinstance(module, nn.Module) else []
        self.storages = [t.data_ptr() for t in self.tensors]
        watched: list[torch.Tensor] = []
        identity_only: list[int] = []
        for guard in guards:
            for position, tensor in guard.tensors.items():
                if position in guard.identity_only:
                    identity_only.append(len(watched))
                watched.append(tensor)
        self.watched = watched
        self.weights = (WeightGuard(range(len(watched)), check, watched, identity_only)
                        if watched and check is not None else None)

    def moved(self) -> bool:
        """Whether a parameter or buffer has new storage since the recording (checked on the host)."""
        return any(t.data_ptr() != ptr for t, ptr in zip(self.tensors, self.storages, strict=True))


class ForwardReplay:
    """``module(*args, **kwargs)`` replayed from one CUDA graph per call signature.

    Args:
        module: the module whose forward is recorded (its compiled blocks are called inside); any
            callable (then only the call's signature is checked: it has no parameters to watch).
        guards: the weight guards of the compiled graphs, read right after each recording (they
            exist only once the first calls have compiled the blocks).
        generation: the backend's generation counter (``kopt_refresh()`` increments it).
        check: how the weights behind derived constants are watched; None: not watched.
        warmup: plain calls per signature before recording (the first compiles the blocks).
        max_graphs: signatures recorded at most; calls of others run plainly.
        on_disabled: called once with the reason when a recording fails (the forward cannot be
            recorded): regional compilation then lets each block's graph replay on its own.
    """

    def __init__(self, module: Callable[..., Any], guards: Callable[[], Iterable[WeightGuard]],
                 generation: Callable[[], int], check: WeightCheck | None = WeightCheck.CHECKSUM,
                 warmup: int = 2, max_graphs: int = 4, on_disabled: Callable[[str], None] | None = None) -> None:
        self.module, self._guards, self._generation, self.check = module, guards, generation, check
        self.on_disabled = on_disabled
        self.warmup, self.max_graphs = warmup, max_graphs
        self.stats = CudaGraphStats()
        self.pool: Any = None
        self._runners: dict[Any, tuple[tuple[Any, ...], CudaGraphRunner]] = {}
        self._guard: ReplayGuard | None = None
        self._guarded_generation = generation()
        self.resets = 0  # recordings dropped because a weight or the compiled graphs changed

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.stats.disabled is not None:
            return self._plain(args, kwargs, None)
        if self._generation() != self._guarded_generation:  # kopt_refresh(): blocks are compiled again
            self.reset()
            self._guarded_generation = self._generation()
        try:
            key, slots = self._key(args, kwargs)
        except TypeError as reason:
            return self._plain(args, kwargs, str(reason))
        entry = self._runners.get(key)
        if entry is None:
            if len(self._runners) >= self.max_graphs:
                return self._plain(args, kwargs, f"{self.max_graphs} call signatures already recorded")
            entry = self._runners[key] = (slots, self._runner(args, kwargs, slots))
        slots, runner = entry
        tensors = [args[s] if kind == "arg" else kwargs[s] for kind, s in slots]
        if not runner.has_graphs:  # warming up, or recording now: the blocks' own checks run
            out = runner(*tensors)
            self.pool = runner.pool  # a failed capture may have replaced it (pool_after_failed_capture)
            if runner.has_graphs:  # just recorded: watch from the state it was recorded in
                self._guard = ReplayGuard(self.module, self._guards(), self.check)
            elif self.stats.disabled is not None and self.on_disabled is not None:
                self.on_disabled(self.stats.disabled)
                self.on_disabled = None
            return out
        guard = self._guard
        assert guard is not None
        if guard.moved():
            return self._changed(args, kwargs, "a parameter or buffer has new storage")
        pending = guard.weights.start(guard.watched) if guard.weights is not None else []
        out = runner(*tensors)
        if any(p for check in pending for p in check.changed()):
            return self._changed(args, kwargs, "a weight behind a derived constant changed")
        return out

    @staticmethod
    def _key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
        """The call's signature, and where its tensors are (TypeError: it cannot be replayed)."""
        slots = tuple([("arg", i) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
                      + [("kw", k) for k, v in kwargs.items() if isinstance(v, torch.Tensor)])
        tensors = [args[s] if kind == "arg" else kwargs[s] for kind, s in slots]
        if not tensors or not all(t.is_cuda for t in tensors):
            raise TypeError("not every tensor argument is on a CUDA device")
        fixed = fixed_key(([(i, a) for i, a in enumerate(args) if not isinstance(a, torch.Tensor)],
                           {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}))
        shapes = tuple((tuple(t.shape), t.dtype, t.device) for t in tensors)
        modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        return (len(args), slots, shapes, fixed, modes), slots

    def _runner(self, args: tuple[Any, ...], kwargs: dict[str, Any], slots: tuple[Any, ...]) -> CudaGraphRunner:
        positional, keywords = list(args), dict(kwargs)

        def call(*tensors: Any) -> Any:
            for (kind, slot), tensor in zip(slots, tensors, strict=True):
                if kind == "arg":
                    positional[slot] = tensor
                else:
                    keywords[slot] = tensor
            return self.module(*positional, **keywords)

        return CudaGraphRunner(call, warmup=self.warmup, max_graphs=1, stats=self.stats, pool=self._pool())

    def _pool(self) -> Any:
        """One memory pool for every recording (they never replay at once: outputs are copied out)."""
        if self.pool is None and torch.cuda.is_available():
            self.pool = torch.cuda.graph_pool_handle()
        return self.pool

    def _plain(self, args: tuple[Any, ...], kwargs: dict[str, Any], reason: str | None) -> Any:
        if reason is not None:
            self.stats.skipped = reason
        self.stats.plain_calls += 1
        return self.module(*args, **kwargs)

    def _changed(self, args: tuple[Any, ...], kwargs: dict[str, Any], reason: str) -> Any:
        self.reset()
        return self._plain(args, kwargs, f"{reason}: recording again")  # each block's guard derives again

    def reset(self) -> None:
        """Drop every recording; the next calls of each signature warm up and record again."""
        if any(runner.has_graphs for _, runner in self._runners.values()):
            self.resets += 1
        self._runners.clear()
        self._guard = None
