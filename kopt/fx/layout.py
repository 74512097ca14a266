"""Whether two tensors of one shape lay their elements out alike in memory.

Strides of size-1 dims never matter: nothing ever steps along them, so ``(8, 1)`` and ``(8, 8)`` are
the same layout for shape ``(4, 1)``. Sizes and strides may be symbolic (a graph captured with dynamic
shapes): a stride counts as equal only where that is provably true, so an unknown difference is a
difference (the safe answer for every caller: each would otherwise let a layout change through).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def same_layout(shape: Sequence[Any], strides: Sequence[Any], other_strides: Sequence[Any]) -> bool:
    """True if ``strides`` and ``other_strides`` step alike along every dim of ``shape`` of size > 1."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if not (len(shape) == len(strides) == len(other_strides)):
        return False
    return all(statically_known_true(size == 1) or statically_known_true(a == b)
               for size, a, b in zip(shape, strides, other_strides, strict=True))
