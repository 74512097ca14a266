"""Module weights that are views of the merged constant built from them: one copy of the bytes.

``sibling-merge`` concatenates the Q/K/V (and modulation) weights of a block into one tensor the
lowered graph reads. Kept beside the module's own weights, that is a second copy of them
(``benchmarks/dit/weight_bytes.py`` measures it). :func:`share` makes each module weight a view
of its block of rows in the merged tensor instead (``param.data = merged[rows]``; the Parameter
object, its shape, strides, dtype and version counter stay), and the original storage is freed.

Why it is valid: a stacked derivation (:class:`kopt.fx.derived.Derivation`) is its sources'
values, row block after row block, so the view holds exactly the values the weight held. Why it
pays twice: after sharing, a write into the weight *is* a write into what the graph reads, however
it is made (``param.data.copy_`` of a LoRA hot-swap included), so such a weight needs no checksum
per call (:func:`aliased`): only a new storage (``param.data = other``, which kopt never re-points,
since the caller may be aliasing ``other`` on purpose) needs noticing, and the version and storage
check sees that for free.

The trade-off (``kopt.compile(share_weights=False)`` keeps the weights as they were): the module's
weights change address, and weights of one block share one storage, which ``torch.save`` keeps as
one storage and which safetensors saves as separate, non-overlapping tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kopt.fx.derived import Derivation


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def adjacent_rows(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The tensor ``torch.cat(tensors)`` would equal, as a view, when ``tensors`` already are
    consecutive contiguous row blocks of one storage; else None."""
    if not tensors:
        return None
    first = tensors[0]
    if first.dim() == 0 or first.device.type == "meta":
        return None
    storage, offset = first.untyped_storage().data_ptr(), first.storage_offset()
    for tensor in tensors:
        if (not tensor.is_contiguous() or tensor.dtype != first.dtype or tensor.device != first.device
                or tensor.shape[1:] != first.shape[1:] or tensor.untyped_storage().data_ptr() != storage
                or tensor.storage_offset() != offset):
            return None
        offset += tensor.numel()
    shape = (sum(t.shape[0] for t in tensors), *first.shape[1:])
    return first.as_strided(shape, _contiguous_strides(shape), first.storage_offset())


def row_blocks(stacked: torch.Tensor, parts: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """Views of ``stacked``'s rows, one per part, shaped like it; None when the parts do not tile
    ``stacked`` (another dtype, device or row width, or a row count that does not add up)."""
    if stacked.dim() == 0 or not stacked.is_contiguous() or stacked.device.type == "meta":
        return None
    if any(p.dtype != stacked.dtype or p.device != stacked.device or p.shape[1:] != stacked.shape[1:]
           for p in parts):
        return None
    if sum(p.shape[0] for p in parts) != stacked.shape[0]:
        return None
    return list(stacked.split([p.shape[0] for p in parts]))


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and a.storage_offset() == b.storage_offset() and a.shape == b.shape
            and a.stride() == b.stride() and a.dtype == b.dtype)


def _stacks(derived: Sequence[tuple[str, torch.Tensor]], records: Mapping[str, Derivation],
            weights: Mapping[str, int], args: Sequence[Any]) -> list[tuple[str, list[int], list[torch.Tensor]]]:
    """Each derived constant stacked from module weights alone: its name, the weights' positions and
    the views of its rows that each weight's values are."""
    found = []
    for name, tensor in derived:
        record = records.get(name)
        if record is None or not record.stacked or not all(s in weights for s in record.sources):
            continue
        positions = [weights[s] for s in record.sources]
        if len(set(positions)) != len(positions):
            continue
        blocks = row_blocks(tensor, [args[p] for p in positions])
        if blocks is not None:
            found.append((name, positions, blocks))
    return found


def share(derived: Sequence[tuple[str, torch.Tensor]], records: Mapping[str, Derivation],
          weights: Mapping[str, int], args: Sequence[Any], moved: list[int] | None = None) -> int:
    """Point each contiguous module weight at its rows of the stacked constant made from it (the
    first one, if several are); returns the bytes of weight storage this let go, and appends the
    positions of the weights it pointed to ``moved``."""
    claimed: set[int] = set()
    freed = 0
    for _, positions, blocks in _stacks(derived, records, weights, args):
        if claimed & set(positions):
            continue
        claimed |= set(positions)
        with torch.no_grad():
            for position, block in zip(positions, blocks, strict=True):
                weight = args[position]
                if _same_view(weight, block) or not weight.is_contiguous() or weight.shape != block.shape:
                    continue
                freed += weight.numel() * weight.element_size()
                weight.data = block
                if moved is not None:
                    moved.append(position)
    return freed


def unshare(args: Sequence[Any], positions: Sequence[int]) -> None:
    """Give each weight at ``positions`` (pointed into a stacked constant by :func:`share`) storage of
    its own again, with the same values: what a graph that will not read the stacked constant needs.
    Valid because :func:`share` only ever makes a contiguous weight a contiguous row block of the
    constant, so a contiguous copy is the weight as it was, at storage offset 0 as dynamo traced it
    (a graph lowered from dynamo's trace after the weights moved fails on the changed offset)."""
    with torch.no_grad():
        for position in positions:
            weight = args[position]
            weight.data = weight.data.clone()


def aliased(derived: Sequence[tuple[str, torch.Tensor]], records: Mapping[str, Derivation],
            weights: Mapping[str, int], depends: Mapping[str, frozenset[int]], stage_reads: frozenset[int],
            args: Sequence[Any]) -> frozenset[int]:
    """Positions of the module weights that are views of the one derived constant depending on
    them: no other derived constant and no memoized stage reads them, so a write to one, however
    made, is a write to what the graph reads, and only a new storage needs noticing."""
    holder: dict[int, str] = {}
    for name, positions, blocks in _stacks(derived, records, weights, args):
        for position, block in zip(positions, blocks, strict=True):
            if _same_view(args[position], block):
                holder[position] = name
    return frozenset(position for position, name in holder.items()
                     if position not in stage_reads
                     and not any(position in depends[other] for other, _ in derived if other != name))
