"""Size symbols of a region: which literal integers are its input sizes, so shapes can be abstracted
(the region class key) or changed (the verifier's awkward-shape trials).

Every distinct input dim size above 1 becomes a symbol ``s0, s1, ...`` in canonical input order;
a size literal in a ``SymInt`` argument that equals a symbol, or a product of two or three distinct
symbols
(``view(x, [s0*s1, s2])`` flattening leading dims), is read as that expression. Size 1 stays literal
because it decides broadcasting, which is structure, not size. Two dims that happen to be equal share
a symbol; that only couples them (fewer shape variants, a narrower class key), it never merges
different computations, because the exact keys keep every literal.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping

Expr = tuple[int, ...]  # a product of symbols, by index


@dataclasses.dataclass(frozen=True)
class SizeSymbols:
    """The symbols of a region: ``values[k]`` is the size symbol ``s{k}`` stands for."""

    values: tuple[int, ...]

    @staticmethod
    def of(shapes: Iterable[tuple[int, ...]]) -> SizeSymbols:
        seen: dict[int, None] = {}
        for shape in shapes:
            for size in shape:
                if size > 1:
                    seen.setdefault(size, None)
        return SizeSymbols(tuple(seen))

    def exprs(self, size: int) -> list[Expr]:
        """Every product of one to three distinct symbols equal to ``size``, shortest first (a
        flattening multiplies distinct dims); empty for a plain literal or size 0 or 1."""
        if size <= 1:
            return []
        return [combo for length in (1, 2, 3) for combo in itertools.combinations(range(len(self.values)), length)
                if math.prod(self.values[i] for i in combo) == size]

    def expr(self, size: int) -> Expr | None:
        """The reading of ``size`` used to rewrite a size argument: the first of :meth:`exprs`."""
        found = self.exprs(size)
        return found[0] if found else None

    def render(self, size: int) -> str:
        expr = self.expr(size)
        return str(size) if expr is None else "*".join(f"s{i}" for i in expr)

    def resize(self, size: int, new_values: Mapping[int, int]) -> int:
        """``size`` with every symbol replaced by its new value (literals unchanged)."""
        expr = self.expr(size)
        if expr is None:
            return size
        return math.prod(new_values.get(i, self.values[i]) for i in expr)

    def resized_options(self, size: int, new_values: Mapping[int, int]) -> set[int]:
        """What ``size`` may become under every reading of it (one value for a plain literal)."""
        found = self.exprs(size)
        if not found:
            return {size}
        return {math.prod(new_values.get(i, self.values[i]) for i in e) for e in found}

    def resize_shape(self, shape: tuple[int, ...], new_values: Mapping[int, int]) -> tuple[int, ...]:
        """An input shape with its dims resized: input dims are single symbols or 1 by construction."""
        return tuple(new_values.get(self.values.index(d), d) if d > 1 else d for d in shape)
