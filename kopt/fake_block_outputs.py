"""Output metadata of opaque block calls, remembered while one call of the model compiles.

Under ``between_blocks="compiled"`` the model's graph calls each repeated block through one op
(:mod:`kopt.opaque_blocks`), whose fake implementation runs the block as written on fake tensors.
Everything that propagates shapes through the model's graph runs it again for every block call:
dynamo's trace, kopt's capture, each pass that propagates shapes, the lowering. FLUX.1's graph
calls 57 blocks: seconds of Python per propagation, whatever the widths
(``benchmarks/tools/opaque_compile_time.py`` measures compile + first call on tiny widths).

A block's output metadata (shapes, strides, dtypes, devices, and which outputs are None) is a
function of its code, its weights' shapes and dtypes, its other state, the call's structure and its
arguments' metadata. :func:`block_key` holds all of these: the class, every parameter's and
buffer's name, shape, dtype and device, and a fingerprint of the non-tensor state of every module in
the block (plain values as they are; containers element by element; any other object by its type
and, two levels down, its own state, beyond that by identity, so only the same object matches).
With the call's structure, its arguments' layouts and whether autocast is on, two blocks with
equal keys compute outputs laid out alike for arguments laid out alike, so one
fake run serves both: the 57 calls of FLUX.1 cost one run per block class. Valid only while the
state cannot change, so a memo lives for one call of the compiled model (:func:`remembering`):
dynamo traces, kopt compiles, and the memo goes. A symbolic size gives no key (a run per call).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import types
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from kopt.fx.symbolic import static_int

Meta = tuple[tuple[int, ...], tuple[int, ...], torch.dtype, torch.device]
Remembered = tuple[list[Meta], Any]  # the outputs' metadata and their layout (kopt.opaque_blocks._outputs)

_MEMO: contextvars.ContextVar[dict[Any, Any] | None] = contextvars.ContextVar("kopt_fake_block_outputs",
                                                                               default=None)
_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.Size)
_DEPTH = 2  # how far into an object that is not a module the fingerprint looks before comparing identity
_ROUTINES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial)


@contextlib.contextmanager
def remembering() -> Iterator[None]:
    """Within the block, block calls with equal keys share one fake run (module docstring); nested
    uses share the outermost memo."""
    if _MEMO.get() is not None:
        yield
        return
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def _fingerprint(value: Any, depth: int) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_fingerprint(v, depth) for v in value))
    if isinstance(value, (set, frozenset)):
        return ("set", tuple(sorted(repr(_fingerprint(v, depth)) for v in value)))
    if isinstance(value, dict):
        return ("dict", tuple((repr(k), _fingerprint(v, depth)) for k, v in value.items()))
    if isinstance(value, nn.Module):
        return ("module", id(value))  # a module outside the block's tree: only itself
    state = getattr(value, "__dict__", None)
    if depth > 0 and isinstance(state, dict) and not isinstance(value, _ROUTINES):  # e.g. an attention processor
        return (type(value).__qualname__, _state(state, depth - 1))
    return (type(value).__qualname__, id(value))


def _own(name: str) -> bool:
    """What kopt itself puts on a block: its opaque ``forward``, handle and compiled code."""
    return name == "forward" or name.startswith("_kopt")


def _state(attributes: dict[str, Any], depth: int) -> tuple:
    return tuple((name, _fingerprint(value, depth)) for name, value in sorted(attributes.items()) if not _own(name))


def block_key(block: nn.Module) -> tuple:
    """What a block's output metadata depends on besides its call (module docstring)."""
    modules = []
    for name, module in block.named_modules(remove_duplicate=False):
        attributes = {k: v for k, v in vars(module).items() if k not in ("_parameters", "_buffers", "_modules")}
        tensors = tuple((n, tuple(t.shape), t.dtype, t.device)
                        for n, t in [*module._parameters.items(), *module._buffers.items()] if t is not None)
        modules.append((name, type(module).__qualname__, tensors, _state(attributes, _DEPTH)))
    return tuple(modules)


def static_meta(tensor: torch.Tensor) -> Meta | None:
    """A tensor's shape, strides, dtype and device; None where a size is symbolic."""
    shape, stride = [static_int(d) for d in tensor.shape], [static_int(d) for d in tensor.stride()]
    if None in shape or None in stride:
        return None
    return tuple(shape), tuple(stride), tensor.dtype, tensor.device


def call_key(block: nn.Module, structure: Any, tensors: Sequence[torch.Tensor]) -> tuple | None:
    """The memo's key for one call of ``block`` (None: no memo active, or a symbolic size)."""
    memo = _MEMO.get()
    if memo is None:
        return None
    metas = [static_meta(t) for t in tensors]
    if None in metas:
        return None
    keys = memo.setdefault("blocks", {})
    if id(block) not in keys:
        keys[id(block)] = block_key(block)
    autocast = tuple(torch.is_autocast_enabled(device) for device in ("cuda", "cpu"))
    return keys[id(block)], structure, tuple(metas), autocast


def recalled(key: tuple | None) -> Remembered | None:
    """What an earlier call with ``key`` produced, if one did in this memo."""
    memo = _MEMO.get()
    return None if key is None or memo is None else memo.get(key)


def remember(key: tuple | None, outputs: Sequence[torch.Tensor], layout: Any) -> None:
    """Keep the outputs' metadata and layout under ``key`` (nothing if any size is symbolic)."""
    memo = _MEMO.get()
    if key is None or memo is None:
        return
    metas = [static_meta(out) for out in outputs]
    if None not in metas:
        memo[key] = (metas, layout)
