"""One layout per block call: the strides of size-1 dimensions made canonical before a compiled block runs.

A dimension of size 1 is never stepped along, so its stride addresses nothing: two tensors that
differ only there hold the same elements in the same places (``is_contiguous`` ignores it too). Dynamo
guards every stride of a tensor it compiled for, though, so a block called first with a tensor of its
own and then with a slice of a wider one compiled twice. FLUX.1 at batch 1 does exactly that: its
first single block takes the double blocks' output, each later one a slice of the tokens its
predecessor concatenated; the slice's batch stride counts the text tokens too. The second graph cost
about 1 s of every warm compile and more of a cold one.

Valid because the view made shares the tensor's storage, offset and every stride that addresses an
element; only what dynamo compares changes. The canonical stride is the one a contiguous layout of
the dimensions inside it would give (``stride * size`` of the next dimension, 1 for the last), the
rule ``torch.empty`` follows, so a tensor created fresh is left as it is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch


def canonical_unit_strides(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself, or a view of it whose size-1 dimensions have canonical strides (module docstring)."""
    sizes = tensor.shape
    if 1 not in sizes or tensor.numel() == 0:
        return tensor
    strides = list(tensor.stride())
    inner = 1  # the canonical stride of the dimension being visited, were it of size 1
    for dim in range(len(sizes) - 1, -1, -1):
        if sizes[dim] == 1:
            strides[dim] = inner
        inner = strides[dim] * sizes[dim]
    if tuple(strides) == tensor.stride():
        return tensor
    return tensor.as_strided(sizes, strides, tensor.storage_offset())


def _canonical(value: Any) -> Any:
    return canonical_unit_strides(value) if isinstance(value, torch.Tensor) else value


def with_canonical_unit_strides(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` called with its tensor arguments' size-1 strides made canonical (the top level of
    its positional and keyword arguments: what a block's ``forward`` takes)."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        return function(*[_canonical(a) for a in args], **{k: _canonical(v) for k, v in kwargs.items()})

    return call
