"""Replay a lowered graph from a CUDA graph: one launch per call instead of one per kernel.

A rewritten DiT forward still launches ~700–1800 kernels; from Python each launch costs host time,
and the host can fall tens of milliseconds behind the GPU per forward (``median − kernels`` in the
benchmark's breakdown). :class:`CudaGraphRunner` records the lowered callable once per input
signature (shapes, dtypes, devices, non-tensor values) and afterwards copies the call's tensors
into the recorded input buffers and replays.

Valid because the lowered graph is a pure function of its inputs (weights are constants frozen
into it, inference only, static shapes): replaying the recorded kernels on the same buffers with the
new values copied in computes what calling it would. What could go wrong, and how it is handled:

* weights are inputs too (:mod:`kopt.fx.weights`): those at ``static_inputs`` are recorded in
  place, not copied (a replay reads the parameter's own storage, so an in-place write to it is
  what the next replay computes with); their addresses are part of the signature, so weights at
  new addresses (``param.data = new``, or another block's weights through the same graph) are
  recorded as a signature of their own;
* the recorded outputs are overwritten by the next replay, so each call returns fresh copies
  (``clone_outputs``; a DiT's output is the small latent, so the copy is cheap);
* recordings of one runner that differ only in their weights (a repeated block's graph, one
  recording per block) share one set of input buffers: replays run one after another on one
  stream and each copies its inputs in first, so no replay can read another's (otherwise every
  block holds a copy of the hidden states). Only when outputs are copied out,
  since a recorded output may alias an input buffer;
* warm-up (autotuning, cuBLAS/cuDNN plan selection, lazy initialisation) must not be recorded, so
  a signature is called ``warmup`` times normally, then once on a side stream, before recording;
* a new signature records a new graph, up to ``max_graphs``; beyond that, or for inputs that are
  not all CUDA tensors, or with autograd recording, the callable runs normally (and says why in
  :attr:`CudaGraphStats.skipped`);
* a Python number sent to the GPU (``torch.as_tensor(n, device="cuda")``, a pageable copy that
  capture refuses) is recorded as a fill kernel of the same value (:mod:`kopt.host_scalars`);
* a recording that fails (an op that cannot be captured), or whose first replay does not compute
  what the plain call computed on the same inputs (:func:`replay_mismatch`), disables graphs for
  the runner, runs normally, and the reason is kept in :attr:`CudaGraphStats.disabled`, with the
  first line that read a GPU value on the host, if the call did (:mod:`kopt.host_reads`);
* a forward that reads GPU values on the host (transformers' attention-mask helpers do) fails its
  first recording; the next one bakes the values read in and checks them on the device at every
  replay, and a replay whose values differ is dropped for a plain call (:mod:`kopt.host_reads`);
  its warm-up also takes the branch that code asking "is this stream capturing?" takes under
  capture, so that what the recording runs was compiled before it (:mod:`kopt.capture_branch`);
  what the failed capture left behind is undone first (:func:`pool_after_failed_capture`).

The counters live in a :class:`CudaGraphStats` that the compile report holds and prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from kopt.capture_branch import as_if_capturing, really_capturing
from kopt.host_scalars import host_scalars_as_fills


def capturing() -> bool:
    """Whether the current stream is recording a CUDA graph (kopt's whole-forward replay, or the
    caller's own): then nothing may wait for the device or record a graph of its own."""
    return really_capturing()


def _signature(args: Sequence[Any], skip: frozenset[int] = frozenset()) -> tuple[Any, ...] | str:
    """A hashable signature of the call, or why the call cannot be replayed from a graph. Inference
    mode is part of it: buffers recorded under it cannot be written outside it. Inputs at ``skip``
    (weights: their shapes are fixed by dynamo's guards, their storage checked apart) are left out."""
    parts: list[Any] = [("inference_mode", torch.is_inference_mode_enabled())]
    for index, arg in enumerate(args):
        if index in skip:
            continue
        if isinstance(arg, torch.Tensor):
            if not arg.is_cuda:
                return f"input {index} is on {arg.device}, not a CUDA device"
            parts.append((tuple(arg.shape), arg.dtype, arg.device))
        elif arg is None or isinstance(arg, (bool, int, float, str)):
            parts.append(("value", arg))
        else:
            return f"input {index} is a {type(arg).__name__} (only tensors and plain values are replayed)"
    return tuple(parts)


_COPYABLE = (torch.Tensor, bool, int, float, str, type(None))  # output leaves a replay can hand out


@dataclasses.dataclass
class CudaGraphStats:
    """What a :class:`CudaGraphRunner` did so far (updated live; the report prints it)."""

    recorded: int = 0
    replays: int = 0
    plain_calls: int = 0
    skipped: str | None = None  # why the last call ran without a graph (None: it replayed)
    disabled: str | None = None  # why graphs are off for good (a recording failed)
    baked_reads: int = 0  # host reads baked into recordings, checked on the device per replay
    guard_misses: int = 0  # replays whose baked reads differed, dropped for a plain call

    def describe(self) -> str:
        """One line for the report."""
        if self.disabled:
            return f"CUDA graphs disabled: {self.disabled}"
        text = f"CUDA graphs: {self.recorded} recorded, {self.replays} replays, {self.plain_calls} plain calls"
        if self.baked_reads:
            text += (f", {self.baked_reads} host read(s) baked in and checked per replay ({self.guard_misses} "
                     "replay(s) read other values and ran plainly)")
        return text + (f" (last call ran without a graph: {self.skipped})" if self.skipped else "")


@dataclasses.dataclass
class _Recorded:
    graph: torch.cuda.CUDAGraph
    inputs: list[Any]
    outputs: Any
    copied: list[int]  # the inputs copied into the recorded buffers before each replay (not weights)
    guard: torch.Tensor | None = None  # set by a replay whose baked host reads differ (kopt.host_reads)


def pool_after_failed_capture(pool: Any, stream: torch.cuda.Stream) -> Any:
    """Undo what a capture into ``pool`` that raised left behind, and return the pool to record into next.

    ``torch.cuda.graph`` ends the allocator's routing to its pool and restores the caller's stream
    only when the capture ends cleanly. After one that raised, the current stream is still the
    capture stream (``stream``, the caller's, is set back here), and the allocator still holds
    ``pool`` as being recorded to: the next recording into it fails ("beginAllocateToPool: already
    recording to mempool_id"), so a forward whose first recording failed on a host read could
    never be recorded with the read baked in. The stale routing is ended where torch exposes the
    call (best effort: any error is ignored), and the next recording gets a fresh pool and a capture
    stream of its own either way (should the routing survive, it applies to the old stream only).
    The device's random generator is taken out of capture mode too (:func:`end_generator_capture`)."""
    torch.cuda.set_stream(stream)
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if end is not None:
        try:
            end(torch.cuda.current_device(), pool)
        except Exception:  # noqa: BLE001 - nothing was routed, or this torch ends it differently
            pass
    try:
        end_generator_capture()
    except Exception as error:  # noqa: BLE001 - the caller's fallback must still run; the user must know
        warnings.warn(f"kopt: after a failed CUDA-graph capture the device's random generator could not be "
                      f"taken out of capture mode ({type(error).__name__}: {error}); random ops on this "
                      "device may now raise 'Offset increment outside graph capture'", RuntimeWarning, stacklevel=2)
    return torch.cuda.graph_pool_handle()


def end_generator_capture() -> None:
    """Take the current device's default random generator out of the capture mode a failed capture
    left it in.

    A capture puts the generator in capture mode when it begins and takes it out where it ends
    cleanly; a capture that raised never gets there, and from then on every random op outside a
    capture in the whole process (``torch.randn(..., device="cuda")``, dropout) raises "Offset
    increment outside graph capture encountered unexpectedly". Valid repair: a capture that ends
    cleanly begins and ends that mode on the same generator, so one tiny capture, dropped at once,
    leaves it as it was before the failed one (its seed and offset untouched: nothing random runs)."""
    scratch = torch.zeros(1, device=torch.device("cuda", torch.cuda.current_device()))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        scratch.add_(1)
    del graph


def describe_failure(error: BaseException) -> str:
    """``error`` for a human, by its first cause: an op that cannot run while a stream is capturing
    raises inside ``torch.cuda.graph``, whose exit then raises "operation failed due to a previous
    error during capture", which says nothing of the op; the first one does."""
    seen, first = {id(error)}, error
    while first.__context__ is not None and id(first.__context__) not in seen:
        first = first.__context__
        seen.add(id(first))

    def line(e: BaseException) -> str:
        return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"

    return line(first) if first is error else f"{line(first)} (then {line(error)})"


class CudaGraphRunner:
    """``fn(*args)`` replayed from a CUDA graph per input signature (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any], *, warmup: int = 1, max_graphs: int = 4,
                 clone_outputs: bool = True, static_inputs: Sequence[int] = (),
                 stats: CudaGraphStats | None = None, pool: Any = None) -> None:
        """``stats`` and ``pool`` may be shared with other runners of one compiled graph: counters
        summed, and one memory pool for all their recordings (safe as long as they never replay
        concurrently, since each replay's outputs are copied out before the next one runs)."""
        self.fn, self.warmup, self.max_graphs, self.clone_outputs = fn, warmup, max_graphs, clone_outputs
        self.static_inputs = frozenset(static_inputs)
        self._graphs: dict[tuple[Any, ...], _Recorded] = {}
        self._calls: dict[tuple[Any, ...], int] = {}
        self._pool: Any = pool
        self._buffers: dict[tuple[Any, ...], list[Any]] = {}  # input buffers per signature less the weights
        self._bake_reads = False  # a recording failed on host reads: the next one bakes them in
        self._retrying = False  # a recording failed: the next one warms up as if capturing (the last try)
        self._capture_stream: torch.cuda.Stream | None = None  # None: torch's; a new one after a failed capture
        self.stats = stats if stats is not None else CudaGraphStats()

    @property
    def pool(self) -> Any:
        """The memory pool this runner records into (created on first use unless one was given)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    @property
    def has_graphs(self) -> bool:
        """Whether this runner holds a recording (replays of it are possible)."""
        return bool(self._graphs)

    def __call__(self, *args: Any) -> Any:
        if self.stats.disabled is not None:
            self.stats.plain_calls += 1
            return self.fn(*args)
        if capturing():  # inside a recording of a larger forward: its graph holds these kernels
            return self.fn(*args)
        signature = _signature(args, self.static_inputs)
        if isinstance(signature, str):
            return self._plain(signature, args)
        inputs_signature = signature
        signature = (*signature, ("weights at", tuple(args[i].data_ptr() for i in sorted(self.static_inputs))))
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return self._plain("autograd is recording (CUDA graphs here are for inference)", args)
        recorded = self._graphs.get(signature)
        if recorded is None:
            calls = self._calls.get(signature, 0)
            if calls < self.warmup:
                self._calls[signature] = calls + 1
                return self._plain("warming up this input signature", args)
            if len(self._graphs) >= self.max_graphs:
                return self._plain(f"{self.max_graphs} input signatures already recorded", args)
            try:
                recorded = self._record(args, inputs_signature)
            except Exception as error:  # noqa: BLE001 - an uncapturable op: run without graphs from now on
                return self._after_failed_recording(error, args)
            self._graphs[signature] = recorded
            self.stats.recorded += 1
        targets, sources = [], []
        for index in recorded.copied:
            static, arg = recorded.inputs[index], args[index]
            if static.data_ptr() != arg.data_ptr():
                targets.append(static)
                sources.append(arg)
        if targets:  # one multi-tensor launch: a staged graph copies ~100 hoisted values per memo miss
            torch._foreach_copy_(targets, sources)
        recorded.graph.replay()
        if recorded.guard is not None and bool(recorded.guard):  # one wait, only where reads were baked in
            self.stats.guard_misses += 1
            return self._plain("a value the recording read on the host differs on this call", args)
        self.stats.replays += 1
        self.stats.skipped = None
        if not self.clone_outputs:
            return recorded.outputs
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, recorded.outputs)

    def _after_failed_recording(self, error: BaseException, args: Sequence[Any]) -> Any:
        """The plain call after a failed recording, watching where it reads a GPU value on the host
        (:mod:`kopt.host_reads`), the usual cause. After the first failure the next recording is the
        last try: it warms up twice on the branch a capture takes (:mod:`kopt.capture_branch`) and
        bakes in the reads the second warm-up makes (checked on the device at every replay). Twice
        because the first call down that branch passes new inputs to the compiled blocks (transformers
        builds a mask there instead of None), which compile for them, and compiling reads values on the
        host (kopt's first-call checks) that no later call repeats: baked, the capture would miss them.
        After the second failure graphs are off for good, with the reason and the first such place in
        :attr:`CudaGraphStats.disabled`."""
        from kopt.host_reads import call_noting_host_reads

        failure = f"recording failed: {describe_failure(error)}"
        torch.cuda.synchronize()
        self.stats.plain_calls += 1
        try:
            out, reads = call_noting_host_reads(self.fn, args)
        except Exception:  # noqa: BLE001 - only a diagnosis: the plain call must still happen
            out, reads = self.fn(*args), []
        where = (f"{reads[0]}" + (f" and {len(reads) - 1} more place(s)" if len(reads) > 1 else "")) if reads else ""
        if not self._retrying:
            self._retrying, self._bake_reads = True, bool(reads)
            self.stats.skipped = (f"{failure}; the next recording warms up as a capture would run"
                                  + (f" and bakes in what the call reads on the host at {where}" if reads else ""))
        else:
            self.stats.disabled = failure + (f"; the call reads a GPU value on the host, a wait no graph can hold, "
                                             f"at {where}" if reads else "")
        return out

    def _plain(self, reason: str, args: Sequence[Any]) -> Any:
        self.stats.skipped = reason
        self.stats.plain_calls += 1
        return self.fn(*args)

    def _record(self, args: Sequence[Any], inputs_signature: tuple[Any, ...]) -> _Recorded:
        from kopt.host_reads import BakedReads, ReadLog

        inputs = self._input_buffers(args, inputs_signature)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        log = ReadLog() if self._bake_reads else contextlib.nullcontext()
        branch = as_if_capturing() if self._retrying else contextlib.nullcontext()  # kopt.capture_branch
        # The warm-ups run with the capture's own torch.tensor (kopt.host_scalars): code compiled by dynamo
        # guards on that function, so its first call under the fills recompiles — here, not in the capture,
        # where a compile's device work (kopt's checks, Inductor's) would invalidate the recording.
        if self._retrying:  # the capture branch's first call compiles what it needs: not logged (below)
            with torch.cuda.stream(side), as_if_capturing(), host_scalars_as_fills():
                self.fn(*inputs)
        with torch.cuda.stream(side), log, branch, host_scalars_as_fills():  # on a side stream, as capture requires
            expected = self.fn(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        guard, baked = None, contextlib.nullcontext()
        if self._bake_reads and log.values:  # kopt.host_reads: the values just read, checked per replay
            guard = torch.zeros((), dtype=torch.bool, device=torch.device("cuda", torch.cuda.current_device()))
            baked = BakedReads(log.values, guard)
        graph, caller = torch.cuda.CUDAGraph(), torch.cuda.current_stream()
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=self._capture_stream), host_scalars_as_fills(), \
                    baked:  # kopt.host_scalars
                if guard is not None:
                    guard.zero_()  # recorded: each replay starts with a clear flag
                outputs = self.fn(*inputs)
        except BaseException:
            self._pool = pool_after_failed_capture(self._pool, caller)
            self._capture_stream = torch.cuda.Stream()
            raise
        if guard is not None:
            baked.check_all_used()
        leaves, _ = tree_flatten(outputs)
        opaque = [type(leaf).__name__ for leaf in leaves if not isinstance(leaf, _COPYABLE)]
        if opaque:  # a replay overwrites the recorded outputs: each must be copied out per call
            raise RuntimeError(f"outputs of type {opaque[0]} cannot be copied out of a replay")
        graph.replay()  # the recording computes what the plain call did, or it is not used
        if guard is not None and bool(guard):
            raise RuntimeError("the values the recording read on the host differ on the inputs they were read from")
        mismatch = replay_mismatch(outputs, expected)
        if mismatch is not None:
            raise RuntimeError(f"the first replay differs from the plain call: {mismatch}")
        copied = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor) and i not in self.static_inputs]
        if guard is not None:
            self.stats.baked_reads += len(log.values)
        return _Recorded(graph, inputs, outputs, copied, guard)


    def _input_buffers(self, args: Sequence[Any], inputs_signature: tuple[Any, ...]) -> list[Any]:
        """The recording's inputs: the weights themselves, and for the others buffers holding the call's
        values, shared by every recording of this signature when outputs are copied out (module docstring)."""
        shared = self._buffers.get(inputs_signature) if self.clone_outputs else None
        if shared is None:
            inputs = [a.clone() if isinstance(a, torch.Tensor) and i not in self.static_inputs else a
                      for i, a in enumerate(args)]
            if self.clone_outputs:
                self._buffers[inputs_signature] = inputs
            return inputs
        inputs = list(shared)
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and i not in self.static_inputs:
                inputs[i].copy_(a)
            else:
                inputs[i] = a
        return inputs


def replay_mismatch(replayed: Any, expected: Any, rtol: float = 1e-3) -> str | None:
    """Why a replay's outputs are not the plain call's (None when they are): the same structure,
    shapes, dtypes and NaN/Inf positions, floating values within ``rtol`` relative error (the same
    kernels on the same inputs; the margin admits kernels whose reduction order varies run to
    run), everything else equal."""
    got, got_spec = tree_flatten(replayed)
    want, want_spec = tree_flatten(expected)
    if got_spec != want_spec:
        return "the outputs have a different structure"
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            if a != b:
                return f"output {index} is {a!r}, not {b!r}"
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {index} is {a.dtype} {tuple(a.shape)}, not {b.dtype} {tuple(b.shape)}"
        if not (a.is_floating_point() or a.is_complex()):
            if not torch.equal(a, b):
                return f"output {index} differs"
            continue
        if a.element_size() == 1:  # FP8: no isfinite or arithmetic of its own; float32 holds it exactly
            a, b = a.float(), b.float()
        finite = torch.isfinite(b)
        if not torch.equal(torch.isfinite(a), finite) or not torch.equal(torch.isnan(a), torch.isnan(b)):
            return f"output {index} has NaN/Inf where the plain call has none, or the reverse"
        a64, b64 = a[finite].to(torch.complex128 if a.is_complex() else torch.float64), b[finite].to(
            torch.complex128 if b.is_complex() else torch.float64)
        error, scale = (a64 - b64).abs().norm().item(), b64.abs().norm().item()
        if error > rtol * scale + 1e-30:
            return f"output {index}: relative error {error / max(scale, 1e-30):.2e} > {rtol:g}"
    return None
