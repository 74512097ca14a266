"""Where a call reads a device tensor's value on the host: the reason its CUDA-graph recording fails.

Reading a GPU value in Python (``bool(mask.all())``, ``.item()``, ``int(t)``) copies it to the host
and waits for the device, which a stream that is recording a graph refuses ("operation not permitted
when stream is capturing"); the error names the copy, not the line that asked for it. Every such
read reaches the dispatcher as ``aten._local_scalar_dense``, so a dispatch mode around one plain call
sees each of them and the Python frames that made it. That one call runs under the compiler stance
``force_eager``: dynamo refuses to run compiled code under a dispatch mode and, left to itself, marks
each compiled frame it meets there as skipped for good, so every later call of the compiled blocks
would run eagerly; the stance makes those frames run eagerly for this call only and touches no
cache. Transformers' attention-mask helpers do this in eager mode (``_ignore_causal_mask_sdpa``
reads ``padding_mask.all()``) when no stream is capturing (:mod:`kopt.capture_branch` covers the
other branch), so a Llama forward whose top level runs eagerly fails its first recording.

A recording can still hold such a call when the value it read is baked in and checked: the run just
before the recording (same inputs) logs each value Python code reads (:class:`ReadLog`); during the
recording each such read returns the logged value instead of waiting, and adds to a device flag whether the device's
value differs (:class:`BakedReads`): comparisons the graph then replays every time. A replay after
which the flag is set computed the branch of another value: its result is dropped and the call runs
plainly. Valid because the recorded kernels are exactly those the plain call runs when every read
gives its logged value, and the flag is set whenever one does not; the price is one wait per replay
(reading the flag), paid only by recordings that baked a read.

Only used where a recording failed (the dispatch overhead of one plain call, once per runner) and in
the recording after it.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_TORCH = os.path.dirname(torch.__file__)


def _caller(stack: Sequence[traceback.FrameSummary]) -> str:
    """The innermost frame outside torch (and this file), with the one that called it."""
    outside = [f for f in stack if not f.filename.startswith(_TORCH) and f.filename != __file__]
    if not outside:
        return "inside torch"
    frame = outside[-1]
    where = f"{_short(frame.filename)}:{frame.lineno} in {frame.name}"
    if len(outside) > 1:
        parent = outside[-2]
        where += f" (called from {_short(parent.filename)}:{parent.lineno} in {parent.name})"
    return where


def _short(filename: str) -> str:
    """The path from the package folder on (``transformers/masking_utils.py``)."""
    parts = filename.replace(os.sep, "/").split("/")
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) + 1:])
    return "/".join(parts[-2:])


class _HostReads(TorchDispatchMode):
    def __init__(self, devices_only: bool) -> None:
        super().__init__()
        self.devices_only, self.found = devices_only, []

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            tensor = args[0]
            if not self.devices_only or tensor.device.type != "cpu":
                where = _caller(traceback.extract_stack()[:-1])
                if where not in self.found:
                    self.found.append(where)
        return func(*args, **(kwargs or {}))


def call_noting_host_reads(fn: Callable[..., Any], args: Sequence[Any], *,
                           devices_only: bool = True) -> tuple[Any, list[str]]:
    """``fn(*args)``, and where it read a tensor's value on the host (each place once, in order);
    with ``devices_only`` only reads of tensors not on the CPU (those are the syncs)."""
    mode = _HostReads(devices_only)
    with torch.compiler.set_stance("force_eager"), mode:  # module docstring: compiled code stays compiled
        out = fn(*args)
    return out, mode.found


# The Tensor methods through which Python code reads a tensor's value (all end in _local_scalar_dense).
# Logging and baking patch these rather than use a dispatch mode: under a dispatch mode dynamo runs
# compiled functions eagerly, so a recording made under one would hold the blocks' eager kernels.
READ_METHODS = ("__bool__", "__int__", "__float__", "__index__", "item")


@contextlib.contextmanager
def _reads_through(handler: Callable[[torch.Tensor, Callable[[torch.Tensor], Any]], Any],
                   devices_only: bool) -> Iterator[None]:
    """Within the block, each of :data:`READ_METHODS` on a tensor (not on the CPU with ``devices_only``)
    goes through ``handler(tensor, original_method)``."""
    own = {name: torch.Tensor.__dict__.get(name) for name in READ_METHODS}
    originals = {name: getattr(torch.Tensor, name) for name in READ_METHODS}

    def routed(original: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], Any]:
        def read(tensor: torch.Tensor) -> Any:
            if devices_only and tensor.device.type == "cpu":
                return original(tensor)
            return handler(tensor, original)

        return read

    for name, original in originals.items():
        setattr(torch.Tensor, name, routed(original))
    try:
        yield
    finally:
        for name, method in own.items():
            if method is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, method)


class ReadLog:
    """A context manager logging the value of each host read of a device tensor (every tensor without
    ``devices_only``), in order, in :attr:`values`."""

    def __init__(self, devices_only: bool = True) -> None:
        self.devices_only, self.values = devices_only, []
        self._patch: Any = None

    def __enter__(self) -> ReadLog:
        def log(tensor: torch.Tensor, original: Callable[[torch.Tensor], Any]) -> Any:
            value = original(tensor)
            self.values.append(value)
            return value

        self._patch = _reads_through(log, self.devices_only)
        self._patch.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._patch.__exit__(*exc)


class BakedReads:
    """A context manager in which each host read of a device tensor returns the next value of ``values``
    (a :class:`ReadLog` of the same call) without reading the device, and ORs into the 0-d bool tensor
    ``flag`` whether the tensor's value differs from it (device-side ops: a recording replays them)."""

    def __init__(self, values: Sequence[Any], flag: torch.Tensor, devices_only: bool = True) -> None:
        self.values, self.flag, self.devices_only, self.used = list(values), flag, devices_only, 0
        self._patch: Any = None

    def __enter__(self) -> BakedReads:
        def baked(tensor: torch.Tensor, original: Callable[[torch.Tensor], Any]) -> Any:
            if self.used >= len(self.values):
                raise RuntimeError(f"the call read {self.used + 1} values on the host; the run before it read "
                                   f"{len(self.values)}")
            value = self.values[self.used]
            self.used += 1
            self.flag.logical_or_(tensor.ne(value).reshape(()))
            return value

        self._patch = _reads_through(baked, self.devices_only)
        self._patch.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._patch.__exit__(*exc)

    def check_all_used(self) -> None:
        """Raise unless the call read as many values as the logged run did."""
        if self.used != len(self.values):
            raise RuntimeError(f"the call read {self.used} values on the host; the run before it read "
                               f"{len(self.values)}")
