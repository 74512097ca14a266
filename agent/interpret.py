"""Run a region graph on real (or fake) tensors: at other sizes, in higher precision, on any device.

* **Sizes.** ``resize`` maps size symbols (:mod:`kopt.agent.sizes`) to new values; every ``SymInt``
  argument is rewritten through them, so ``view(x, [s0*s1, s2])`` follows the new shape. A resize
  is valid only if every node's shape follows the same substitution (:func:`resize_problem`): a
  literal such as ``slice(x, -1, 0, 1536)`` that is half of a size is not a symbol, and a region
  that depends on one keeps its captured shape.
* **Precision.** ``promote=torch.float64`` runs every float value in float64: inputs are promoted
  and every float dtype argument (``_to_copy(dtype=bf16)``, ``full(dtype=f32)``) becomes float64.
  That is the region's mathematics with rounding removed, the reference the verifier measures error
  against: intermediate roundings are the original's error, not part of its meaning.
* **Device.** Device arguments follow the inputs, so a region captured on a GPU runs on the CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kopt.agent.schema_args import size_arguments
from kopt.agent.sizes import SizeSymbols

_COMPLEX_PROMOTION = {torch.complex32: torch.complex128, torch.complex64: torch.complex128}


def _promote_dtype(dtype: torch.dtype, promote: torch.dtype | None) -> torch.dtype:
    if promote is None:
        return dtype
    if dtype.is_complex:
        return _COMPLEX_PROMOTION.get(dtype, dtype)
    return promote if dtype.is_floating_point else dtype


def promote_tensor(value: torch.Tensor, promote: torch.dtype | None) -> torch.Tensor:
    return value.to(_promote_dtype(value.dtype, promote)) if promote is not None else value


class RegionInterpreter(torch.fx.Interpreter):
    """Runs a canonical region graph with sizes, float dtypes and devices remapped (see module doc)."""

    def __init__(self, module: torch.fx.GraphModule, *, symbols: SizeSymbols | None = None,
                 resize: Mapping[int, int] | None = None, promote: torch.dtype | None = None,
                 device: torch.device | None = None) -> None:
        super().__init__(module, garbage_collect_values=True)
        self.symbols, self.resize, self.promote, self.device = symbols, dict(resize or {}), promote, device
        self.shapes: dict[str, tuple[int, ...]] = {}

    def _map_sizes(self, value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, (int, list, tuple)):
            return value
        if isinstance(value, int):
            return self.symbols.resize(value, self.resize) if self.symbols is not None else value
        return type(value)(self._map_sizes(v) for v in value)

    def _map_literal(self, value: object) -> object:
        if isinstance(value, torch.dtype):
            return _promote_dtype(value, self.promote)
        if isinstance(value, torch.device) and self.device is not None:
            return self.device
        if isinstance(value, (list, tuple)):
            return type(value)(self._map_literal(v) for v in value)
        return value

    def call_function(self, target, args, kwargs):  # type: ignore[override]
        if self.resize:
            positions, names = size_arguments(target)
            args = tuple(self._map_sizes(a) if i in positions else a for i, a in enumerate(args))
            kwargs = {k: self._map_sizes(v) if k in names else v for k, v in kwargs.items()}
        args = tuple(self._map_literal(a) for a in args)
        kwargs = {k: self._map_literal(v) for k, v in kwargs.items()}
        return super().call_function(target, args, kwargs)

    def get_attr(self, target, args, kwargs):  # type: ignore[override]
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor):
            value = promote_tensor(value, self.promote)
            if self.device is not None:
                value = value.to(self.device)
        return value

    def run_node(self, node: torch.fx.Node) -> object:
        result = super().run_node(node)
        if isinstance(result, torch.Tensor):
            self.shapes[node.name] = tuple(int(d) for d in result.shape)
        return result


def run_region(module: torch.fx.GraphModule, inputs: Sequence[torch.Tensor], *, symbols: SizeSymbols | None = None,
               resize: Mapping[int, int] | None = None, promote: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
    """The region's outputs on ``inputs`` (already at the resized shapes), optionally in ``promote``."""
    device = inputs[0].device if inputs else None
    interpreter = RegionInterpreter(module, symbols=symbols, resize=resize, promote=promote, device=device)
    with torch.no_grad():
        outputs = interpreter.run(*(promote_tensor(t, promote) for t in inputs))
    return tuple(outputs)


def empty_with_layout(shape: Sequence[int], like_stride: Sequence[int], like_shape: Sequence[int],
                      dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """An uninitialized tensor of ``shape`` laid out like a tensor of ``like_shape``/``like_stride``:
    the same dim order in memory, and broadcast (stride-0) dims kept broadcast."""
    from kopt.agent.canonical import stride_order

    order = stride_order(tuple(like_shape), tuple(like_stride))
    broadcast = [d for d in range(len(shape)) if like_stride[d] == 0 and like_shape[d] != 1]
    alloc_shape = [1 if d in broadcast else shape[d] for d in order]
    base = torch.empty(alloc_shape, dtype=dtype, device=device)
    inverse = [order.index(d) for d in range(len(shape))]
    return base.permute(inverse).expand(*shape) if broadcast else base.permute(inverse)


def resize_problem(module: torch.fx.GraphModule, symbols: SizeSymbols, resize: Mapping[int, int],
                   input_layouts: Sequence[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]) -> str | None:
    """None if the region runs at the resized sizes with every node's shape following the
    substitution; otherwise why not (a literal size the symbols do not explain)."""
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_mode:
        inputs = [empty_with_layout(symbols.resize_shape(shape, resize), stride, shape, dtype)
                  for shape, stride, dtype in input_layouts]
    interpreter = RegionInterpreter(module, symbols=symbols, resize=resize)
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)  # a failed resize is an answer here, not an error to log
    try:
        with fake_mode, torch.no_grad():
            interpreter.run(*inputs)
    except Exception as error:  # noqa: BLE001 - any failure means this resize is not the same region
        return f"does not run at the new sizes: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
    finally:
        fake_log.setLevel(level)
    for node in module.graph.nodes:
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or node.name not in interpreter.shapes:
            continue
        actual = interpreter.shapes[node.name]
        options = [symbols.resized_options(int(d), resize) for d in value.shape]
        if len(actual) != len(options) or any(a not in o for a, o in zip(actual, options, strict=False)):
            return f"{node.name} has shape {actual}, which the size symbols do not explain"
    return None
