"""Which arguments of an ATen op are sizes: the ``SymInt`` arguments of its schema.

ATen spells sizes (``view``'s ``size``, ``slice``'s ``end``, ``full``'s ``size``) as ``SymInt`` and
dims (``sum``'s ``dim``, ``slice``'s ``dim``) as ``int``, so the schema says exactly which literal
integers of a node are shapes. Region keys drop shapes only there (a class key holds across sizes)
and resizing a region rewrites only there; a ``dim=-1`` or an exponent ``2`` is never touched.
"""

from __future__ import annotations

import functools

import torch


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index].strip())
            start = index + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


@functools.cache
def _argument_types(schema: str) -> tuple[tuple[str, str], ...]:
    """(name, declared type) of each argument of ``schema`` (``aten::view(Tensor(a) self, SymInt[] size)``)."""
    inside = schema[schema.index("(") + 1: schema.rindex(") ->") if ") ->" in schema else schema.rindex(")")]
    arguments = []
    for part in _split_top_level(inside):
        if part == "*":
            continue
        declaration = part.split("=")[0].strip()
        type_text, _, name = declaration.rpartition(" ")
        arguments.append((name, type_text))
    return tuple(arguments)


def size_arguments(target: object) -> tuple[frozenset[int], frozenset[str]]:
    """(positions, keyword names) of ``target``'s arguments declared ``SymInt`` / ``SymInt[]``; empty
    for targets without a schema (``operator.getitem``)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return frozenset(), frozenset()
    arguments = _argument_types(str(schema))
    positions = {i for i, (_, kind) in enumerate(arguments) if kind.startswith("SymInt")}
    return frozenset(positions), frozenset(arguments[i][0] for i in positions)


def is_size_argument(target: object, position: int | None, keyword: str | None) -> bool:
    """Whether the argument at ``position`` (or named ``keyword``) of ``target`` holds sizes."""
    positions, names = size_arguments(target)
    return (position is not None and position in positions) or (keyword is not None and keyword in names)


def op_name(target: object) -> str:
    """A stable name for an FX call target: ``aten.add.Tensor``, ``getitem``."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))
