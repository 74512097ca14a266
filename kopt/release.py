"""Release the weights a compiled model no longer reads: ``kopt.compile(..., release_weights=True)``,
the default with ``fp8`` (:func:`release_by_default`).

kopt freezes weights into the rewritten graph, and some rewrites replace them with new constants:
``fp8-linear`` reads FP8 copies, ``sibling-merge`` concatenated ones. The user's module still holds
the originals, so both are resident (FLUX.2 with FP8: 64 GB of bf16 weights beside 30 GB of FP8).
After the first call has compiled every graph, :func:`release_unread_weights` frees the storage of
each captured constant that no compiled graph reads: ``untyped_storage().resize_(0)``, which keeps
the tensor's shape, dtype and device (dynamo's guards on the module still hold) but drops its bytes.

Valid because a compiled graph only reads the constants its ``get_attr`` nodes name (or, for a
graph that fell back to the original, all of its inputs, which are then kept). The cost is that
the module can no longer run or be compiled again: the original forward would read empty storage,
so a recompilation (new input shapes, changed weights, ``kopt_refresh()``) raises
:class:`WeightsReleasedError` instead of computing garbage.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from kopt.fx.constants import constant_value


def release_by_default(fp8: object, regional: bool = True) -> bool:
    """Whether ``kopt.compile`` releases weights when ``release_weights`` is not given: with FP8 under
    regional compilation, and then only weights on a GPU (:data:`DEFAULT_DEVICES`).

    The FP8 copies replace the bf16 weights as a quantization library's would (torchao quantizes a
    module in place); keeping both would hold 1.5× the model (FLUX.2: 64 GB of bf16 beside 30 GB of
    FP8) and break the promise that a compiled model peaks no higher than eager. Regional compilation
    frees each block's weights as soon as its FP8 copies exist, and compiles again for new shapes from
    the FP8 weights it made (:meth:`kopt.compiled_graph.CompiledGraph._borrow_derived`). A whole-model
    compile holds both through its first call anyway and may need the freed weights to compile for new
    shapes (constants it folded are read live by a graph with symbolic sizes), so it keeps them unless
    asked. Without FP8 nothing is duplicated (merged weights are shared: :mod:`kopt.fx.shared_weights`).
    On the CPU, memory is not what FP8 is for (there it emulates the GPU's numerics): the module is
    left whole.
    """
    return fp8 is not None and fp8 is not False and regional


DEFAULT_DEVICES = ("cuda",)  # where a default release frees weights: device memory is what it saves

Release = bool | tuple[str, ...]  # what a compiled module frees after its first call: all, nothing, or on these devices


def resolve_release(release_weights: bool | None, fp8: object, regional: bool = True) -> Release:
    """``kopt.compile``'s ``release_weights`` made explicit: None means :func:`release_by_default`."""
    if release_weights is None:
        return DEFAULT_DEVICES if release_by_default(fp8, regional) else False
    return bool(release_weights)


class WeightsReleasedError(RuntimeError):
    """A recompilation needed weights that ``release_weights=True`` freed after the first compile."""


def is_released(tensor: object) -> bool:
    """A tensor with elements whose storage holds no bytes (freed by :func:`release_unread_weights`)."""
    return (isinstance(tensor, torch.Tensor) and tensor.device.type != "meta" and tensor.numel() > 0
            and tensor.untyped_storage().nbytes() == 0)


def check_not_released(example_inputs: Sequence[Any], sources: Sequence[str]) -> None:
    """Raise :class:`WeightsReleasedError` naming the first released input of a graph being compiled."""
    for tensor, source in zip(example_inputs, sources, strict=True):
        if is_released(tensor):
            raise WeightsReleasedError(
                f"{source} was released after compiling (release_weights; on by default with regional fp8), and "
                "this call needs a new compilation (new input shapes, changed weights or kopt_refresh()). "
                "Compile with release_weights=False to keep the module's weights, or call the model with the "
                "shapes it was compiled for.")


def stand_ins(example_inputs: Sequence[Any]) -> list[Any]:
    """``example_inputs`` with each released tensor replaced by a new one of its shape, strides, dtype and
    device holding random values: what a compilation can trace and rewrite when the values it derives
    from them are not the ones it will run with (:meth:`kopt.compiled_graph.CompiledGraph._borrow_derived`).
    Random, not zeros, so that no two stand-ins are equal."""
    generator = None
    out: list[Any] = []
    for tensor in example_inputs:
        if not is_released(tensor):
            out.append(tensor)
            continue
        if generator is None:
            generator = torch.Generator(device=tensor.device).manual_seed(0)
        fresh = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=tensor.device)
        if fresh.is_complex():
            torch.view_as_real(fresh).normal_(generator=generator)
        elif fresh.is_floating_point():
            fresh.normal_(generator=generator)
        else:
            fresh.random_(0, 8, generator=generator)
        out.append(fresh)
    return out


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def read_storages(graph_module: torch.fx.GraphModule) -> set[int]:
    """Storages of every constant a (rewritten) graph reads through ``get_attr``."""
    live = set()
    for node in graph_module.graph.nodes:
        value = constant_value(node) if node.op == "get_attr" else None
        if isinstance(value, torch.Tensor) and value.device.type != "meta":
            live.add(_storage(value))
    return live


def release_unread_weights(candidates: Iterable[torch.Tensor], live: set[int],
                           devices: Sequence[str] | None = None) -> int:
    """Free each candidate whose storage no compiled graph reads (only those on ``devices``' types, when
    given); the number of bytes freed."""
    freed = 0
    seen: set[int] = set()
    for tensor in candidates:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta" or is_released(tensor):
            continue
        if devices is not None and tensor.device.type not in devices:
            continue
        storage = _storage(tensor)
        if storage in live or storage in seen:
            continue
        seen.add(storage)
        freed += tensor.untyped_storage().nbytes()
        tensor.untyped_storage().resize_(0)
    return freed
