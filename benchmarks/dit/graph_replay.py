"""Whole-forward CUDA-graph replay for baselines: what kopt's own replay gives kopt, given to them too.

kopt replays each compiled forward from a CUDA graph (:mod:`kopt.cuda_graphs`), which removes the
host's launch gaps; a baseline timed kernel by kernel would lose to kopt partly for that reason alone.
:class:`ReplayedForward` captures a baseline's whole forward (e.g. after diffusers'
``compile_repeated_blocks()``) the same way — static input buffers, the call's tensors copied in,
outputs cloned — by putting kopt's :class:`~kopt.cuda_graphs.CudaGraphRunner` behind the keyword
interface the workloads call.

Tensor keyword arguments become the runner's positional inputs (copied into the recorded buffers
each call); every other argument (``return_dict=False``, Qwen-Image's ``img_shapes`` lists) is a
fixed part of the call, so each distinct set of them gets a runner of its own. When a forward cannot
be captured (an op that syncs with the host or copies a host value to the GPU), the runner runs it
kernel by kernel and :meth:`ReplayedForward.status` says why: such a row's timed median is not a
replay time, and the summary uses its summed kernel time as the best its replay could do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kopt.cuda_graphs import CudaGraphRunner


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


class ReplayedForward:
    """``fn(**kwargs)`` replayed from one CUDA graph per (tensor shapes, other arguments)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self._runners: dict[tuple[Any, ...], tuple[tuple[str, ...], CudaGraphRunner]] = {}

    def __call__(self, **kwargs: Any) -> Any:
        tensors = tuple(name for name, value in kwargs.items() if _is_tensor(value))
        fixed = {name: value for name, value in kwargs.items() if name not in tensors}
        key = (tensors, repr(sorted(fixed.items())))
        if key not in self._runners:
            def positional(*values: Any, _names: tuple[str, ...] = tensors, _fixed: dict = fixed) -> Any:
                return self.fn(**dict(zip(_names, values, strict=True)), **_fixed)

            # warmup=2: the first call compiles (torch.compile is lazy), the second settles any
            # recompilation; the runner adds one more warm-up on a side stream before recording
            self._runners[key] = (tensors, CudaGraphRunner(positional, warmup=2))
        names, runner = self._runners[key]
        return runner(*(kwargs[name] for name in names))

    @property
    def replayed(self) -> bool:
        """True when every runner recorded its graph and its last call replayed it."""
        return bool(self._runners) and all(
            r.stats.recorded and r.stats.disabled is None and r.stats.skipped is None
            for _, r in self._runners.values())

    def status(self) -> str:
        """``replayed`` or why a call ran kernel by kernel, for the row's ``replay`` field."""
        if self.replayed:
            return "replayed"
        reasons = {r.stats.disabled or r.stats.skipped or "not recorded yet" for _, r in self._runners.values()}
        return "not replayed: " + "; ".join(sorted(reasons))
