"""The graph-free form of a fusible region: inputs, normalized steps, outputs (see :mod:`kopt.codegen.region`)."""

from __future__ import annotations

import dataclasses

import torch

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Ref:
    """A reference to value ``index``: inputs are numbered first, then one value per step."""

    index: int


Arg = Ref | float | bool | None


@dataclasses.dataclass(frozen=True)
class Input:
    """A tensor the region reads; broadcast to the full shape when it is smaller."""

    node: str
    shape: Shape
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class Step:
    """One node of the region, normalized: ``op`` is a name in :mod:`kopt.codegen.ops` (or
    ``getitem``), ``args`` its operands, ``params`` reduction settings (keepdim, correction, eps)."""

    node: str
    target: str
    op: str
    args: tuple[Arg, ...]
    shape: Shape
    dtype: torch.dtype | None
    params: tuple[tuple[str, object], ...] = ()

    def param(self, name: str, default: object = None) -> object:
        return dict(self.params).get(name, default)


@dataclasses.dataclass(frozen=True)
class Output:
    """A region value read outside it: ``kind`` is ``full`` (the full shape), ``row`` (one value
    per row, ``(*rows, 1)``) or ``row_flat`` (``(*rows,)``, a reduction without keepdim)."""

    value: int
    node: str
    kind: str
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class Region:
    """What a generated kernel computes. The FX nodes ride along (not compared) for the rewrite."""

    inputs: tuple[Input, ...]
    steps: tuple[Step, ...]
    outputs: tuple[Output, ...]
    full_shape: Shape
    reduction: str | None
    members: tuple[torch.fx.Node, ...] = dataclasses.field(default=(), compare=False, repr=False)
    input_nodes: tuple[torch.fx.Node, ...] = dataclasses.field(default=(), compare=False, repr=False)
    output_nodes: tuple[torch.fx.Node, ...] = dataclasses.field(default=(), compare=False, repr=False)

    @property
    def n(self) -> int:
        return self.full_shape[-1]

    def value_dtype(self, index: int) -> torch.dtype | None:
        if index < len(self.inputs):
            return self.inputs[index].dtype
        return self.steps[index - len(self.inputs)].dtype

    def value_name(self, index: int) -> str:
        """The FX node name behind value ``index``."""
        if index < len(self.inputs):
            return self.inputs[index].node
        return self.steps[index - len(self.inputs)].node


# ------------------------------------------------------------------------------------- normalization
