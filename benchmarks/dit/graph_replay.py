"""Whole-forward CUDA-graph replay for baselines: what kopt's own replay gives kopt, given to them too.

kopt replays each compiled forward from a CUDA graph (:mod:`kopt.cuda_graphs`), which removes the
host's launch gaps; a baseline timed kernel by kernel would lose to kopt partly for that reason alone.
:class:`ReplayedForward` captures a baseline's whole forward (e.g. after diffusers'
``compile_repeated_blocks()``) the same way — static input buffers, the call's tensors copied in,
outputs cloned — with kopt's own :class:`~kopt.forward_replay.ForwardReplay`, the one
``kopt.compile(regional=True)`` uses, less the weight checks (a baseline derives no constants).

Tensor arguments are copied into the recorded buffers each call; every other argument
(``return_dict=False``, Qwen-Image's ``img_shapes`` lists) is a fixed part of the call, so each
distinct set of them gets a recording of its own (a Python number sent to the GPU, as Qwen-Image's
forward sends its text length, is recorded as a fill: :mod:`kopt.host_scalars`). When a forward
cannot be captured (an op that syncs with the host, a host tensor copied in), the runner runs it
kernel by kernel and :meth:`ReplayedForward.status` says why: such a row's timed median is not a
replay time, and the summary uses its summed kernel time as the best its replay could do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kopt.forward_replay import ForwardReplay


class ReplayedForward:
    """``fn(**kwargs)`` replayed from one CUDA graph per call signature."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        # warmup=2: the first call compiles (torch.compile is lazy), the second settles any
        # recompilation; the runner adds one more warm-up on a side stream before recording
        self._replay = ForwardReplay(fn, guards=list, generation=lambda: 0, check=None, warmup=2)

    def __call__(self, **kwargs: Any) -> Any:
        return self._replay(**kwargs)

    @property
    def replayed(self) -> bool:
        """True when a graph was recorded and the last call replayed it."""
        stats = self._replay.stats
        return bool(stats.recorded) and stats.disabled is None and stats.skipped is None

    def status(self) -> str:
        """``replayed`` or why a call ran kernel by kernel, for the row's ``replay`` field."""
        if self.replayed:
            return "replayed"
        stats = self._replay.stats
        return "not replayed: " + (stats.disabled or stats.skipped or "not recorded yet")
