"""A higher-precision reference of the same weights: what a module or graph computes, with less rounding.

Eager bf16 is itself an approximation, so judging a compiled model by its distance to eager bf16 can
call a more accurate result wrong (FLUX.1 rounds ``guidance * 1000`` to bf16 before its sinusoid,
3500 -> 3504; Inductor fuses the multiply and does not round). Every correctness check in kopt
therefore measures against this reference and reports eager's own distance to it beside.

How: the module (or FX graph) runs as written, under a dispatch mode (:class:`HigherPrecision`) that
makes every ATen op compute in the reference dtype: a floating operand of lower precision (a bf16
weight, a bf16 input) is upcast just for that op, a cast or factory op asking for a lower floating
dtype gets the reference dtype instead, and results are therefore in the reference dtype too. This
is what a full upcast copy of the model computes (weights converted exactly: bf16 and fp32 embed in
fp32 and fp64), without the copy: the bf16 weights stay as they are and an op's upcast operands live
only as long as its result needs them (about one layer's weights), so a 32B bf16 model (64 GB) gets
an fp32 reference on a 141 GB card where a 128 GB fp32 copy would not fit next to it. Two
differences from a full copy, both in the reference's favour: explicit ``.float()`` code paths
(timestep embeddings, norms) compute in fp64 on the CPU instead of fp32, and casts to bf16 inside
the forward (``guidance.to(x.dtype)``) do not round. Code that branches on a parameter's dtype
(``self.dtype``) sees the stored dtype, not the reference's.

Reference dtype (:func:`reference_dtype`): float64 on the CPU; on a GPU float32 (with TF32 off), or
float64 when the model already computes in float32. What the mode refuses, it says
(:class:`ReferenceUnavailable`): an in-place write into a stored low-precision tensor (a cache buffer,
an input mutated in place), or a bit-level reinterpretation of a floating tensor (``view(dtype)``).
"""

from __future__ import annotations

import contextvars
import dataclasses
import warnings
import weakref
from collections.abc import Callable, Collection
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from kopt.matmul_precision import full_precision_matmuls

aten = torch.ops.aten

_FLOAT_RANK = {torch.float16: 1, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}
_COMPLEX_OF = {torch.float32: torch.complex64, torch.float64: torch.complex128}
_COMPLEX_RANK = {torch.complex32: 1, torch.complex64: 2, torch.complex128: 3}
# ops whose ``half_to_float`` flag is only valid for a half-precision input (which the mode upcast)
_HALF_TO_FLOAT = (aten._softmax.default, aten._log_softmax.default)


_ACTIVE_DTYPE: contextvars.ContextVar[torch.dtype | None] = contextvars.ContextVar("kopt_reference_dtype",
                                                                               default=None)


class ReferenceUnavailable(RuntimeError):
    """The reference cannot be computed faithfully for this module or graph (the message says why)."""


def reference_dtype(device: torch.device | str, working_dtype: torch.dtype | None = None) -> torch.dtype:
    """float64 on the CPU; on a GPU float32, or float64 if the model already computes in float32."""
    if torch.device(device).type == "cpu":
        return torch.float64
    if working_dtype is not None and _FLOAT_RANK.get(working_dtype, 0) >= _FLOAT_RANK[torch.float32]:
        return torch.float64
    return torch.float32


@dataclasses.dataclass
class ReferenceStats:
    """Bytes of the upcast copies the mode made (weights and inputs of lower precision).

    ``peak_live_bytes`` counts copies whose storage is still alive (a view of a copy keeps it), so
    it bounds what the reference adds to the model's own memory besides activations.
    """

    upcast_bytes: int = 0
    live_bytes: int = 0
    peak_live_bytes: int = 0
    upcasts: int = 0

    def _add(self, tensor: torch.Tensor) -> None:
        size = tensor.untyped_storage().nbytes()
        self.upcasts += 1
        self.upcast_bytes += size
        self.live_bytes += size
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        weakref.finalize(tensor.untyped_storage(), self._release, size)

    def _release(self, size: int) -> None:
        self.live_bytes -= size


class HigherPrecision(TorchDispatchMode):
    """Every ATen op under this mode computes in ``dtype`` (see the module docstring)."""

    def __init__(self, dtype: torch.dtype, stats: ReferenceStats | None = None) -> None:
        super().__init__()
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"the reference dtype must be float32 or float64, got {dtype}")
        self.dtype = dtype
        self.complex_dtype = _COMPLEX_OF[dtype]
        self.stats = stats if stats is not None else ReferenceStats()

    def _wider(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a value of ``dtype`` takes in the reference: never narrower, never non-float."""
        if _FLOAT_RANK.get(dtype, 99) < _FLOAT_RANK[self.dtype]:
            return self.dtype
        if _COMPLEX_RANK.get(dtype, 99) < _COMPLEX_RANK[self.complex_dtype]:
            return self.complex_dtype
        return dtype

    def _upcast(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and self._wider(value.dtype) is not value.dtype:
            wide = value.to(self._wider(value.dtype))
            self.stats._add(wide)
            return wide
        if isinstance(value, torch.dtype):
            return self._wider(value)
        return value

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is aten.view.dtype and args[0].is_floating_point():
            raise ReferenceUnavailable(f"{func} reinterprets the bits of a {args[0].dtype} tensor")
        self._refuse_narrow_writes(func, args, kwargs)
        args, kwargs = pytree.tree_map(self._upcast, (args, kwargs))
        if func in _HALF_TO_FLOAT and args[2]:
            args = (args[0], args[1], False)
        return func(*args, **kwargs)

    def _refuse_narrow_writes(self, func: Any, args: tuple, kwargs: dict) -> None:
        """An op writing into a stored low-precision tensor would write into its upcast copy instead."""
        schema = getattr(func, "_schema", None)
        if schema is None:
            return
        for position, argument in enumerate(schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = args[position] if position < len(args) else kwargs.get(argument.name)
            if isinstance(value, torch.Tensor) and self._wider(value.dtype) is not value.dtype:
                raise ReferenceUnavailable(f"{func} writes in place into a stored {value.dtype} tensor "
                                           f"{tuple(value.shape)} (a buffer or input mutated by the forward)")


# composite ops that compare their operands' dtypes before dispatch reaches the mode
_CHECKS_DTYPES_FIRST = (torch.conv1d, torch.conv2d, torch.conv3d)


class _UpcastBeforeDtypeChecks(TorchFunctionMode):
    """Upcasts the operands of :data:`_CHECKS_DTYPES_FIRST` at the Python API, beside
    :class:`HigherPrecision`: ``conv2d`` refuses a float64 input with a float32 bias in C++ before
    any ATen op is dispatched, so the dispatch mode alone never sees it."""

    def __init__(self, precision: HigherPrecision) -> None:
        super().__init__()
        self.precision = precision

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _CHECKS_DTYPES_FIRST:
            args, kwargs = pytree.tree_map(self.precision._upcast, (args, kwargs))
        return func(*args, **kwargs)


def _narrowest_floating(values: Any) -> torch.Tensor | None:
    """The floating input of the lowest precision: what the model computes in (its bf16 weights, not
    an fp32 guidance input that happens to come first)."""
    floating = [v for v in pytree.tree_leaves(values) if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return min(floating, key=lambda v: _FLOAT_RANK.get(v.dtype, 0), default=None)


def run_reference(fn: Callable[..., Any], *args: Any, dtype: torch.dtype | None = None,
                  upcast_inputs: bool | Collection[int] = False, stats: ReferenceStats | None = None,
                  **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with every op in ``dtype``.

    ``dtype`` defaults to :func:`reference_dtype` of the lowest-precision floating input (an FX
    graph's inputs include its weights). ``upcast_inputs`` converts floating inputs once up front
    (True: all of them; a collection: those positional arguments): user inputs, cheaper than at
    every use, and an in-place op on them then writes the upcast copy, not the caller's tensor.
    Leave the weights out (an FX graph's parameter placeholders): they are upcast op by op, so the
    model is never copied whole."""
    sample = _narrowest_floating((args, kwargs))
    if dtype is None:
        device = sample.device if sample is not None else torch.device("cpu")
        dtype = reference_dtype(device, sample.dtype if sample is not None else None)
    mode = HigherPrecision(dtype, stats)
    active = _ACTIVE_DTYPE.set(dtype)
    if upcast_inputs is True:
        args, kwargs = pytree.tree_map(mode._upcast, (args, kwargs))
    elif upcast_inputs:
        args = tuple(pytree.tree_map(mode._upcast, a) if i in upcast_inputs else a for i, a in enumerate(args))
    try:
        with (torch.no_grad(), full_precision_matmuls(), warnings.catch_warnings(), _UpcastBeforeDtypeChecks(mode),
              mode):
            # torch.rms_norm and layer_norm warn that mixed input/weight dtypes skip their fused kernel:
            # they do, and the unfused path then runs under the mode in the reference dtype
            warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
            return fn(*args, **kwargs)
    finally:
        _ACTIVE_DTYPE.reset(active)


def active_reference_dtype() -> torch.dtype | None:
    """The dtype of the reference computation running now (:func:`run_reference`), or None: an op that
    runs compiled code of its own (:mod:`kopt.opaque_blocks`) runs its module as written instead."""
    return _ACTIVE_DTYPE.get()


def reference_forward(module: torch.nn.Module, *args: Any, dtype: torch.dtype | None = None,
                      stats: ReferenceStats | None = None, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)`` in higher precision: weights upcast op by op, inputs up front. The
    default dtype follows the lowest precision among the inputs and the module's own weights."""
    if dtype is None:
        sample = _narrowest_floating((args, kwargs, list(module.parameters()), list(module.buffers())))
        if sample is not None:
            dtype = reference_dtype(sample.device, sample.dtype)
    return run_reference(module, *args, dtype=dtype, upcast_inputs=True, stats=stats, **kwargs)
