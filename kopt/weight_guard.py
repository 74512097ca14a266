"""Noticing that a weight behind a derived constant changed, however it was written.

``Tensor._version`` counts in-place writes made through the tensor or its ``detach()`` aliases
(``load_state_dict``, ``param.copy_`` under ``no_grad``), and a new storage shows in
``data_ptr()``. Neither sees a write through ``param.data``: ``.data`` is a new tensor with a
version counter of its own. That is how PEFT hot-swaps a LoRA adapter (``param.data.copy_(new)``)
and how it fuses one (``weight.data += delta``), so a guard built on versions alone serves stale
derived constants after a hot-swap.

:class:`WeightGuard` therefore checks, on every call, versions and storages first (free) and then,
with :attr:`WeightCheck.CHECKSUM` (the default), a checksum of every watched weight: each row
(last dimension) summed as 32-bit integer words, wrapping. Any write that changes a row's words
changes that row's sum unless the changes cancel exactly modulo 2**32 (a permutation of words
within one row; for real updates, a chance of 2**-32 per changed row); rows moved to other
positions are seen because the sums are compared row by row. Weights of at most ``SMALL_BYTES``
(biases, norm scales) are compared whole against a copy instead, all of one element width in one
operation: nothing written to them can be missed. Cost: one read of the watched weights per call,
one reduction per large weight, recorded once as a CUDA graph on a GPU (one launch per call). The
results on one device are compared there, and a single flag is read back: never one
synchronisation per weight. On a GPU the comparison runs on a side stream
while the forward runs (:class:`Pending`): a memory-bound read beside a mostly compute-bound
forward; the call waits for the flag only before returning, and on a change derives again and
runs the forward once more (the first run read stale constants and is discarded).
:attr:`WeightCheck.VERSION` skips the checksum (free) and misses ``.data`` writes.

Only weights that a derived value depends on are watched (:mod:`kopt.fx.weights`): the others
are inputs read live by the lowered graph, where a write cannot be missed. Weights that are views
of the merged constant depending on them (``identity_only``, :mod:`kopt.fx.shared_weights`) are
checked by version and storage alone: any write into their bytes already is a write into what the
graph reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

import torch

from kopt.config import WeightCheck
from kopt.cuda_graphs import capturing, pool_after_failed_capture
from kopt.release import is_released

_SAME_SIZE_INTEGER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
SMALL_BYTES = 1 << 16  # weights up to this size are compared whole against a copy, many per op


def _integers(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` (detached; complex as pairs of reals) viewed as integers of the same width."""
    data = tensor.detach()
    if data.is_complex():
        data = torch.view_as_real(data)
    return data.view(_SAME_SIZE_INTEGER[data.element_size()])


def row_checksums(tensor: torch.Tensor) -> torch.Tensor:
    """One 32-bit integer per row (last dimension) of ``tensor``'s bytes: the row's 32-bit words
    summed with wrap-around where the row allows it (a plain vectorised reduction, at memory
    speed), else its elements as integers summed and wrapped to 32 bits (the same sum modulo 2**32
    for aligned rows; slower)."""
    data = tensor.detach()
    if data.is_complex():
        data = torch.view_as_real(data)
    rows = data.reshape(-1, data.shape[-1]) if data.dim() >= 2 else data.reshape(1, -1)
    try:
        return rows.view(torch.int32).sum(dim=-1, dtype=torch.int32)
    except RuntimeError:  # the row's bytes are not a whole number of aligned 32-bit words
        return _integers(rows).sum(dim=-1, dtype=torch.int64).to(torch.int32)


class _Reader:
    """One watched weight: its row checksums (large) or its bytes (small), read the cheap way."""

    def __init__(self, position: int, tensor: torch.Tensor) -> None:
        self.position = position
        self.small = tensor.numel() * tensor.element_size() <= SMALL_BYTES
        self.width = tensor.element_size() * (2 if tensor.is_complex() else 1)
        contiguous = tensor.is_contiguous()
        self._flat = _integers(tensor).reshape(-1) if self.small and contiguous else None  # a view: live
        self._rows: torch.Tensor | None = None
        if not self.small and contiguous and tensor.dim() >= 2 and tensor.shape[-1] * self.width % 4 == 0:
            try:
                self._rows = tensor.detach().reshape(-1, tensor.shape[-1]).view(torch.int32)  # a view: live
            except RuntimeError:
                self._rows = None

    def read(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.small:
            return self._flat if self._flat is not None else _integers(tensor).reshape(-1)
        if self._rows is not None:
            return self._rows.sum(dim=-1, dtype=torch.int32)
        return row_checksums(tensor)


@dataclasses.dataclass
class _DeviceSums:
    """The watched weights on one device: large ones by row checksums, small ones (grouped by
    element width) by their bytes; one flag says whether anything differs."""

    large: list[_Reader]
    small: dict[int, list[_Reader]]
    stored: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)
    lengths: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    _stream: Any = None  # CUDA: the side stream comparisons run on, and the pinned flag they write
    _flag: Any = None
    _graph: Any = None  # CUDA: the comparison recorded as one graph (see :meth:`_record`)
    _recorded: Any = None  # its outputs: (differs per key, any difference)
    graph_error: str | None = None  # why the comparison could not be recorded (launched op by op)

    def current(self, args: Any) -> dict[int, list[torch.Tensor]]:
        """Per key (0: the large weights' row checksums; else a width: the small weights' bytes)."""
        parts = {width: [r.read(args[r.position]) for r in readers] for width, readers in self.small.items()}
        if self.large:
            parts[0] = [r.read(args[r.position]) for r in self.large]
        return parts

    def snapshot(self, args: Any) -> None:
        parts = self.current(args)
        self.stored = {key: torch.cat(values).clone() for key, values in parts.items()}
        self.lengths = {key: [len(v) for v in values] for key, values in parts.items()}

    def launch(self, args: Any) -> Pending:
        """Start comparing; on a CUDA device on a side stream of its own (see :class:`Pending`)."""
        device = args[(self.large or next(iter(self.small.values())))[0].position].device
        if device.type != "cuda":
            differs = self._differs(args)
            return Pending(self, differs, torch.stack([d.any() for d in differs.values()]).any(), None)
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
            self._flag = torch.zeros((), dtype=torch.bool, pin_memory=True)
        self._stream.wait_stream(torch.cuda.current_stream(device))  # see every write queued before the call
        with torch.cuda.stream(self._stream):
            if self._graph is None and self.graph_error is None:
                self._record(args)
            if self._graph is not None:
                self._graph.replay()
                differs, any_differs = self._recorded
            else:
                differs = self._differs(args)
                any_differs = torch.stack([d.any() for d in differs.values()]).any()
            self._flag.copy_(any_differs, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        return Pending(self, differs, self._flag, event)

    def _record(self, args: Any) -> None:
        """Record the comparison as one CUDA graph: a launch per call instead of one per weight (a
        model watches hundreds, and each launch from Python costs more host time than the GPU spends
        on it). Valid because the readers read the weights in place and a recorded graph reads the
        same addresses: a weight given new storage is caught by the storage check first, and
        :meth:`snapshot` (which follows) drops the recording. A recording that fails leaves the
        comparison launched op by op, with the reason in :attr:`graph_error`."""
        graph, caller, pool, began = torch.cuda.CUDAGraph(), torch.cuda.current_stream(), None, False
        try:
            self._differs(args)  # warm-up on this stream: the recording must not allocate first-time state
            pool, began = torch.cuda.graph_pool_handle(), True
            with torch.cuda.graph(graph, pool=pool, stream=self._stream):
                differs = self._differs(args)
                any_differs = torch.stack([d.any() for d in differs.values()]).any()
        except Exception as error:  # noqa: BLE001 - an op that cannot be recorded: compare op by op
            self.graph_error = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"
            if began:  # kopt.cuda_graphs: the stream, the allocator's routing and the random generator
                pool_after_failed_capture(pool, caller)
            return
        self._graph, self._recorded = graph, (differs, any_differs)

    def _differs(self, args: Any) -> dict[int, torch.Tensor]:
        return {key: torch.cat(values) != self.stored[key] for key, values in self.current(args).items()}

    def locate(self, differs: dict[int, torch.Tensor]) -> list[int]:
        """The positions whose part of ``differs`` has a difference (after the flag said there is one)."""
        changed = []
        for key, difference in differs.items():
            readers = self.large if key == 0 else self.small[key]
            for reader, part in zip(readers, difference.split(self.lengths[key]), strict=True):
                if bool(part.any()):
                    changed.append(reader.position)
        return changed


@dataclasses.dataclass
class Pending:
    """A comparison under way: on a GPU it runs on a side stream, beside the forward the caller
    launches meanwhile (the checksum reads memory, the forward mostly computes), and only
    :meth:`changed` waits for it; on the CPU it is already done."""

    group: _DeviceSums | None
    differs: dict[int, torch.Tensor]
    flag: torch.Tensor | None
    event: Any
    known: list[int] | None = None  # the answer, when it needed no comparison (versions, storages)

    @property
    def ready(self) -> bool:
        """True when :meth:`changed` will not wait for the device."""
        return self.event is None

    def changed(self) -> list[int]:
        if self.known is not None:
            return self.known
        if self.event is not None:
            self.event.synchronize()
        assert self.group is not None and self.flag is not None
        return self.group.locate(self.differs) if bool(self.flag) else []


class WeightGuard:
    """Watches the weights at ``positions`` of dynamo's argument list (see the module docstring)."""

    def __init__(self, positions: Sequence[int], check: WeightCheck, args: Sequence[Any],
                 identity_only: Collection[int] = ()) -> None:
        self.check = check
        self.positions = [p for p in positions if isinstance(args[p], torch.Tensor)]
        self.identity_only = frozenset(identity_only)
        self.snapshot(args)

    @property
    def tensors(self) -> dict[int, torch.Tensor]:
        """The watched weights by position (a mapping :meth:`changed` accepts as ``args``)."""
        return dict(self._tensors)

    @property
    def watched_bytes(self) -> int:
        """Bytes a checksum reads per call (0 with :attr:`WeightCheck.VERSION`)."""
        if self.check is not WeightCheck.CHECKSUM:
            return 0
        return sum(t.numel() * t.element_size() for p, t in self._tensors.items()
                   if not is_released(t) and p not in self.identity_only)

    def forget_released(self) -> None:
        """Stop reading weights ``release_weights=True`` freed (no bytes, and no graph reads them)."""
        self.snapshot(self._tensors)

    def snapshot(self, args: Sequence[Any] | dict[int, torch.Tensor],
                 identity_only: Collection[int] | None = None) -> None:
        """Remember the weights as they are now (and, if given, which are checked by version and
        storage alone). Weights ``release_weights=True`` freed keep only the version and storage
        check (new storage for one means new values: derive again, or raise)."""
        if identity_only is not None:
            self.identity_only = frozenset(identity_only)
        self._tensors = {p: args[p] for p in self.positions}
        self._versions = {p: (args[p]._version, args[p].data_ptr()) for p in self.positions}
        self._groups: list[_DeviceSums] = []
        if self.check is not WeightCheck.CHECKSUM:
            return
        by_device: dict[torch.device, _DeviceSums] = {}
        for position in self.positions:
            tensor = args[position]
            if (tensor.device.type == "meta" or tensor.numel() == 0 or is_released(tensor)
                    or position in self.identity_only):
                continue
            group = by_device.setdefault(tensor.device, _DeviceSums([], {}))
            reader = _Reader(position, tensor)
            if reader.small:
                group.small.setdefault(reader.width, []).append(reader)
            else:
                group.large.append(reader)
        self._groups = list(by_device.values())
        for group in self._groups:
            group.snapshot(args)

    def start(self, args: Sequence[Any] | dict[int, torch.Tensor]) -> list[Pending]:
        """Start checking the watched weights against the last :meth:`snapshot`: versions and
        storages at once, then (checksum) one comparison per device, those on a GPU left running."""
        moved = [p for p in self.positions
                 if (args[p]._version, args[p].data_ptr()) != self._versions[p]]
        # inside a recording nothing may wait: the recorder checks before each replay (kopt.forward_replay)
        if moved or self.check is not WeightCheck.CHECKSUM or capturing():
            return [Pending(None, {}, None, None, known=moved)]
        return [group.launch(args) for group in self._groups]

    def changed(self, args: Sequence[Any] | dict[int, torch.Tensor]) -> list[int]:
        """Positions of the watched weights that changed since the last :meth:`snapshot` (waits)."""
        return [p for pending in self.start(args) for p in pending.changed()]
