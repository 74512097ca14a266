"""A graph's kopt kernels compiled side by side before the graph first runs.

The first launch of a kopt op with a new specialization JIT-compiles its Triton kernel (Triton's
passes, then ``ptxas`` in a subprocess), and the graph's first run (its verification and lowering
check, op by op) meets them one after another: a cold compile of FLUX.2 FP8 on an H100 spent 7.3 s
there, 5.0 s of it waiting for ``ptxas``. Here each distinct kopt op call of the rewritten graph is
launched once beforehand, on zero-filled tensors of the shapes, strides and dtypes the graph gives
it, the first alone in the caller's thread (what is built once per process, LLVM's targets, the
launchers, is built before threads share it), the others in a thread pool, in the caller's device,
stream and grad modes (:mod:`kopt.kernels._precompile`, whose measurement showed such launches
overlap). The graph's run that follows finds the kernels compiled.

Valid because a launch on fresh tensors reads and writes only memory of its own, and its outputs
are dropped: what the graph computes is unchanged, only when each kernel is compiled. Zeros, not
uninitialized memory, so that an index or offset input stays in bounds. Not launched here:

* ``kopt::opaque_block`` (a whole block, compiled by its own graph) and ops with symbolic sizes;
* a kernel whose launch config is not known yet (no choice in this process, in the cache or shipped):
  tuning times candidates and must run alone, so it is left to the first run, as before
  (:func:`kopt.kernels._autotune.known_choices_only`);
* anything off CUDA, and while a CUDA graph is being captured (a launch there would be recorded);
* calls beyond a quarter of the device's free memory, counted as if all were alive at once (their
  arguments and as much again): the graph's own run must find its memory.

A launch that fails here is ignored: the graph's own run meets the same failure where it is handled.
``KOPT_AUTOTUNE_THREADS`` caps the threads, as for autotuning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from kopt.cuda_graphs import capturing
from kopt.kernels._autotune import known_choices_only
from kopt.kernels._precompile import side_by_side

log = logging.getLogger("kopt")

NOT_KERNELS = frozenset({"opaque_block"})  # kopt ops that run more than a kernel of their own
MEMORY_SHARE = 0.25  # of the device's free memory, at most, for the launches' tensors together


def _is_kernel_call(node: torch.fx.Node) -> bool:
    target = node.target
    return (node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
            and target.namespace == "kopt" and target._schema.name.split("::")[-1] not in NOT_KERNELS)


def _zeros_like_meta(value: torch.Tensor) -> torch.Tensor | None:
    """A zero tensor laid out as the fake tensor ``value``, on its device; None when a size is symbolic
    (reading its hint would add a guard)."""
    if any(isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride(), value.storage_offset())):
        return None
    return torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype,
                               device=value.device).zero_()


class _Unknown(Exception):
    """An argument this module cannot rebuild (symbolic, or without a recorded value)."""


def _argument(arg: Any) -> Any:
    if isinstance(arg, torch.fx.Node):
        value = arg.meta.get("val")
        if isinstance(value, torch.Tensor):
            tensor = _zeros_like_meta(value)
            if tensor is None:
                raise _Unknown(arg.name)
            return tensor
        if isinstance(value, (int, float, bool)) and not isinstance(value, torch.SymInt):
            return value
        raise _Unknown(arg.name)
    if isinstance(arg, (list, tuple)):
        return type(arg)(_argument(a) for a in arg)
    if isinstance(arg, torch.SymInt):
        raise _Unknown(str(arg))
    return arg


def _signature(arg: Any) -> Any:
    """What decides a call's specialization: each tensor argument's layout and dtype, other values as is."""
    if isinstance(arg, torch.fx.Node):
        value = arg.meta.get("val")
        if isinstance(value, torch.Tensor):
            return (tuple(value.shape), tuple(value.stride()), value.dtype)
        return ("value", str(value))
    if isinstance(arg, (list, tuple)):
        return tuple(_signature(a) for a in arg)
    return ("const", repr(arg))


def kernel_calls(graph_module: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """One node per distinct kopt kernel call of ``graph_module`` (op, argument layouts and values)."""
    seen: set[Any] = set()
    calls = []
    for node in graph_module.graph.nodes:
        if not _is_kernel_call(node):
            continue
        key = (str(node.target), _signature(list(node.args)), _signature(sorted(node.kwargs.items())))
        if key not in seen:
            seen.add(key)
            calls.append(node)
    return calls


def call_bytes(node: torch.fx.Node) -> int:
    """What launching ``node`` on fresh tensors allocates, about: its tensor arguments, and as much again
    for its outputs and scratch."""
    total = 0
    for arg in node.all_input_nodes:
        value = arg.meta.get("val")
        if isinstance(value, torch.Tensor) and not any(isinstance(s, torch.SymInt) for s in value.shape):
            total += value.numel() * value.element_size()
    return 2 * total


def within_memory(calls: list[torch.fx.Node], budget: float) -> list[torch.fx.Node]:
    """The calls, in order, while their :func:`call_bytes` summed stay within ``budget``: every launch's
    tensors could be alive at once, and the graph's own run must still find its memory."""
    kept, used = [], 0
    for node in calls:
        need = call_bytes(node)
        if used + need <= budget:
            kept.append(node)
            used += need
    return kept


def _launch(node: torch.fx.Node) -> bool:
    """Run ``node``'s op once on zero tensors; whether it ran."""
    try:
        args = _argument(list(node.args))
        kwargs = {k: _argument(v) for k, v in node.kwargs.items()}
        with known_choices_only():
            node.target(*args, **kwargs)
        return True
    except Exception:  # noqa: BLE001 - symbolic, not tuned yet, or failing: the graph's run handles it
        return False


def warm_up_kernels(graph_module: torch.fx.GraphModule, device: torch.device, graph_index: int = 0) -> int:
    """Launch each distinct kopt kernel call of ``graph_module`` once, side by side (module docstring),
    ``device`` being where the graph runs; the number of calls launched."""
    if device.type != "cuda" or capturing():
        return 0
    found = kernel_calls(graph_module)
    calls = within_memory(found, torch.cuda.mem_get_info(device)[0] * MEMORY_SHARE)
    if not calls:
        return 0
    start = time.perf_counter()
    launched, workers = launch_side_by_side(calls, device)
    log.info("graph %d: %d of %d kopt kernel calls launched ahead in %.1f s (%d threads)%s", graph_index, launched,
             len(found), time.perf_counter() - start, workers,
             f"; {len(found) - len(calls)} left out for memory" if len(calls) < len(found) else "")
    return launched


def launch_side_by_side(calls: list[torch.fx.Node], device: torch.device, threads: int | None = None,
                        launch: Callable[[torch.fx.Node], bool] = _launch) -> tuple[int, int]:
    """``launch`` each call, side by side (:func:`kopt.kernels._precompile.side_by_side`); (calls
    launched, threads used)."""
    results, workers = side_by_side(calls, launch, device, threads, name="kopt-warmup")
    return sum(bool(r) for r in results), workers
