"""One compiled graph, many modules' weights: derived tensors and a guard per set of parameters.

Regional compilation (diffusers' ``compile_repeated_blocks``: ``torch.compile`` of each block) runs
one dynamo graph, so one kopt-compiled graph, for every block of the same class, each call with
the parameters of another block. Weights read live need nothing for that; the constants kopt
derived (a block's merged Q/K/V, its FP8 weights) belong to one block's parameters. So
:class:`WeightSets` keeps one set of derived tensors, and one :class:`~kopt.weight_guard.WeightGuard`,
per set of parameter *objects* the graph is called with:

* a call with other parameter objects (another block) selects that block's set, computing it on
  the block's first call;
* a write into a parameter (same object, new values or new storage) is a change within the
  current set, seen by its guard and derived again in place.

When a block's weights were freed (``release_weights``) before this graph first ran with them
(dynamo compiled the block class again, and the newer graph now serves a block the older one
served), the set takes the derived tensors another graph of the backend made from the same weight
objects by the same recipe (:meth:`~kopt.fx.weights.WeightBinding.recipe`) instead of computing them.

Valid because a parameter object is one module's weight for its life (``param.data = new`` keeps
the object). Sets whose parameters were all garbage-collected are dropped when a new set is made,
so replacing a model's parameters (``load_state_dict(assign=True)``) does not keep the old derived
tensors alive once the old parameters are gone.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from kopt.config import WeightCheck
from kopt.fx.weights import WeightBinding
from kopt.release import WeightsReleasedError
from kopt.weight_guard import WeightGuard


@dataclasses.dataclass
class _Set:
    parameters: tuple[weakref.ref, ...]
    derived: list[tuple[str, torch.Tensor]]
    guard: WeightGuard | None
    recipes: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)  # one per derived tensor

    def belongs_to(self, args: Sequence[Any], positions: Sequence[int]) -> bool:
        return all(ref() is args[p] for ref, p in zip(self.parameters, positions, strict=True))

    def alive(self) -> bool:
        return any(ref() is not None for ref in self.parameters)


class WeightSets:
    """The derived tensors and guard of each set of parameters a compiled graph is called with.

    Args:
        binding: the graph's weight binding; its ``derived`` list is switched to the selected set's.
        args: the first call's arguments (the compile-time derived tensors belong to them).
        check: how each set's guard watches its weights; None watches nothing (``on_weight_change="ignore"``).
        share: make each set's module weights views of the merged constants built from them
            (:mod:`kopt.fx.shared_weights`).
        siblings: the other compiled graphs' weight sets, to take derived tensors from when this
            set's weights were released (module docstring).
    """

    def __init__(self, binding: WeightBinding, args: Sequence[Any], check: WeightCheck | None,
                 share: bool = True, siblings: Callable[[], Iterable[WeightSets]] = tuple) -> None:
        self.binding, self.check, self.share, self.siblings = binding, check, share, siblings
        self._sets: dict[tuple[int, ...], _Set] = {}
        self._new: list[tuple[int, ...]] = []  # sets made since the last take_new_sources()
        self._key = self._add(args, binding.derived)

    @property
    def guard(self) -> WeightGuard | None:
        """The guard of the selected set (assignable: benchmarks compare checks on one compiled graph)."""
        return self._sets[self._key].guard

    @guard.setter
    def guard(self, guard: WeightGuard | None) -> None:
        self._sets[self._key].guard = guard

    @property
    def count(self) -> int:
        """How many sets are held (1 unless the graph serves several modules' weights)."""
        return len(self._sets)

    def guards(self) -> list[WeightGuard]:
        """Every set's guard (a whole-forward replay watches them all before each replay)."""
        return [entry.guard for entry in self._sets.values() if entry.guard is not None]

    def derived_storages(self) -> set[int]:
        """Storages of every set's derived tensors (module weights shared with them live there)."""
        return {t.untyped_storage().data_ptr() for entry in self._sets.values() for _, t in entry.derived
                if t.device.type != "meta"}

    def source_weights(self, keep_positions: Sequence[int]) -> list[torch.Tensor]:
        """Every set's module weights behind a derived value, but those at ``keep_positions`` (read
        live by the graph): what ``release_weights=True`` may free once the derived values exist."""
        keep = set(keep_positions)
        found = []
        for entry in self._sets.values():
            for ref, position in zip(entry.parameters, self.binding.sources, strict=True):
                tensor = ref()
                if tensor is not None and position not in keep:
                    found.append(tensor)
        return found

    def forget_released(self, keys: Sequence[tuple[int, ...]] | None = None) -> None:
        """Stop reading weights ``release_weights=True`` freed, in every set (or those of ``keys``)."""
        for key, entry in self._sets.items():
            if entry.guard is not None and (keys is None or key in keys):
                entry.guard.forget_released()

    def take_new_sources(self, keep_positions: Sequence[int]) -> tuple[list[tuple[int, ...]], list[torch.Tensor]]:
        """The sets made since the last call, and their module weights behind a derived value but those
        at ``keep_positions`` (read live): what an early release may free once those sets exist."""
        keys, self._new = [k for k in self._new if k in self._sets], []
        keep = set(keep_positions)
        found = [ref() for key in keys for ref, position in zip(self._sets[key].parameters, self.binding.sources,
                                                                strict=True) if position not in keep]
        return keys, [t for t in found if t is not None]

    def select(self, args: Sequence[Any]) -> bool:
        """Select the set of ``args``' parameters, making it on their first call; True if it changed."""
        key = tuple(id(args[p]) for p in self.binding.sources)
        if key == self._key:
            return False
        entry = self._sets.get(key)
        if entry is None or not entry.belongs_to(args, self.binding.sources):  # ids are reused after collection
            self._sets = {k: s for k, s in self._sets.items() if s.alive()}
            key = self._add(args, self._derive(args))
        self._key = key
        self.binding.derived = self._sets[key].derived
        return True

    def _derive(self, args: Sequence[Any]) -> list[tuple[str, torch.Tensor]]:
        """The derived tensors of ``args``' weights: computed, or, when those were released, taken
        from a sibling graph's set with the same recipes (else the release error stands)."""
        try:
            return self.binding.fresh(args)
        except WeightsReleasedError:
            wanted = [self.binding.recipe(name, args) for name, _ in self.binding.derived]
            for sibling in self.siblings():
                found = sibling.derived_by_recipe(wanted)
                if found is not None:
                    return [(name, tensor) for (name, _), tensor in zip(self.binding.derived, found, strict=True)]
            raise

    def derived_by_recipe(self, recipes: Sequence[tuple[Any, ...]]) -> list[torch.Tensor] | None:
        """The derived tensors one live set holds for exactly these recipes, in their order; None if no set does."""
        for entry in self._sets.values():
            if not entry.alive():
                continue
            by_recipe = dict(zip(entry.recipes, (t for _, t in entry.derived), strict=True))
            if all(r in by_recipe for r in recipes):
                return [by_recipe[r] for r in recipes]
        return None

    def _add(self, args: Sequence[Any], derived: list[tuple[str, torch.Tensor]]) -> tuple[int, ...]:
        key = tuple(id(args[p]) for p in self.binding.sources)
        if self.share:  # this block's weights become views of its merged constants (kopt.fx.shared_weights)
            self.binding.share_storage(args, derived)
        guard = None
        if self.check is not None:
            guard = WeightGuard(self.binding.sources, self.check, args, self.binding.aliased(args, derived))
        recipes = [self.binding.recipe(name, args) for name, _ in derived]
        self._sets[key] = _Set(tuple(weakref.ref(args[p]) for p in self.binding.sources), derived, guard, recipes)
        self._new.append(key)
        return key
