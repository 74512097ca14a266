"""An :class:`~kopt.fp8.config.Fp8Config`'s include and skip patterns, applied block by block under
regional compilation.

Regional compilation (:mod:`kopt.regional`) traces one block of a class and runs its graph for every
block of the class, so inside that graph a weight is named by its path in the block
(``attn.to_q.weight``): a pattern that names layers (``transformer_blocks.0.*``,
``model.layers.*.mlp.*``) would match nothing, or the first block's choice would hold for all. Here
each block's weights are selected by their paths in the model; the blocks that select the same
linears (named by their path in the block) form a group with one graph of its own, compiled with a
config that selects exactly those (:func:`selecting` puts it in effect while the group's blocks run,
and :meth:`kopt.backend.KoptBackend.active_passes` reads it).

Valid because every block's graph then quantizes exactly the linears the patterns name in that
block, and the blocks of a group run the same code on equally selected weights. The other fields of
the config (granularity, gate, attention, ``min_features``) are the user's, unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import fnmatch
from collections.abc import Iterator, Sequence

from torch import nn

from kopt.fp8.config import Fp8Config

# an include pattern no weight path matches: a group whose blocks select none of their linears
NOTHING = "<no linear of this block>"
_SELECTION: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar("kopt_fp8_block_selection",
                                                                                     default=None)


@dataclasses.dataclass(frozen=True)
class BlockGroup:
    """Blocks whose weights ``config`` selects alike: ``selection`` holds the selected weights' paths
    in the block (None: no FP8 config, nothing to select)."""

    selection: tuple[str, ...] | None
    blocks: tuple[nn.Module, ...]


def _selected(config: Fp8Config, names: tuple[str, str]) -> bool:
    """Whether a weight named ``names`` (its path in the model, its path in the block) is included by
    some pattern under either name and skipped by none."""
    def hits(patterns: tuple[str, ...]) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for name in names for pattern in patterns)

    return hits(config.include) and not hits(config.skip)


def block_selection(config: Fp8Config, block: nn.Module, prefix: str) -> tuple[str, ...]:
    """The paths in ``block`` of the weights (2-D, or batched) ``config`` selects, a pattern naming a weight by its path
    in the model (``prefix`` + path in the block) or by its path in the block (what a regional
    compile matched before, and what the agent's per-group choices name); ``min_features`` and the
    other conditions are the pass's."""
    return tuple(sorted(name for name, weight in block.named_parameters(remove_duplicate=False)
                        if weight.dim() >= 2 and _selected(config, (prefix + name, name))))


def block_groups(model: nn.Module, blocks: Sequence[nn.Module], config: Fp8Config) -> list[BlockGroup]:
    """``blocks`` (the repeated blocks, in model order) grouped by what ``config`` selects in each; a
    block whose position is not in ``config.blocks`` selects nothing. One group with no selection
    (None) where no pattern names a layer and ``blocks`` is unset: each block's graph then selects by
    the paths in its block, exactly as before this module."""
    beyond = [b for b in config.blocks or () if b >= len(blocks)]
    if beyond:
        raise ValueError(f"Fp8Config(blocks=...) names block positions {beyond}, but {type(model).__name__} has "
                         f"{len(blocks)} repeated blocks (positions 0-{len(blocks) - 1})")
    names = {id(module): name for name, module in model.named_modules()}
    groups: dict[tuple[str, ...], list[nn.Module]] = {}
    as_in_block = config.blocks is None  # stays True while every block selects by its paths in the block alone
    for position, block in enumerate(blocks):
        name = names.get(id(block), "")
        chosen = config.blocks is None or position in config.blocks
        selection = block_selection(config, block, f"{name}." if name else "") if chosen else ()
        as_in_block = as_in_block and selection == block_selection(config, block, "")
        groups.setdefault(selection, []).append(block)
    if as_in_block:  # the patterns name no layer: each graph selects by the paths in its block, as always
        return [BlockGroup(None, tuple(blocks))] if blocks else []
    return [BlockGroup(selection, tuple(members)) for selection, members in groups.items()]


def block_config(config: Fp8Config, selection: Sequence[str]) -> Fp8Config:
    """``config`` selecting exactly ``selection`` (paths in the block), nothing when it is empty."""
    return dataclasses.replace(config, include=tuple(selection) or (NOTHING,), skip=(), blocks=None)


def refuse_blocks_outside_regional(config: Fp8Config | None) -> None:
    """``Fp8Config.blocks`` names repeated blocks, which only a regional compilation tells apart: a
    whole-model graph would quantize every block's linears, so it is refused, not ignored."""
    if config is not None and config.blocks is not None:
        raise ValueError(f"Fp8Config(blocks={list(config.blocks)}) selects repeated blocks by position, which "
                         "needs kopt.compile(..., regional=True); a whole-model compile would quantize every "
                         "block (select layers by weight path with include/skip instead)")


@contextlib.contextmanager
def selecting(selection: tuple[str, ...]) -> Iterator[None]:
    """While a block group's blocks run (and compile): FP8 passes select ``selection``."""
    token = _SELECTION.set(selection)
    try:
        yield
    finally:
        _SELECTION.reset(token)


def current_selection() -> tuple[str, ...] | None:
    """The selection of the block group running now, or None outside any (a whole model, the code
    between the blocks)."""
    return _SELECTION.get()
