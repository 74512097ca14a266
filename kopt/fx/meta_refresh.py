"""Shape metadata after a pass, recomputed only where the pass changed something.

Passes read ``meta["val"]`` (a FakeTensor: shape, dtype, strides) of the nodes they match, so after
a pass that rewrote the graph the metadata must describe the new graph. Propagating FakeTensors
through the whole graph after every such pass costs one fake dispatch per node per pass, which
grows with the model's depth times the number of passes (``benchmarks/dit/compile_time.py``
shows the passes' time). :func:`refresh` recomputes only

* nodes the pass created, nodes whose operation or arguments it changed (for a constant, also the
  tensor its name holds), nodes without metadata;
* and, transitively, users of a recomputed node whose value came out different (shape, dtype,
  strides, device, or a constant FakeTensor's value).

Why it is valid: a node's FakeTensor is a function of its operation, its arguments and its inputs'
FakeTensors alone, so a node with the same operation and arguments whose inputs' metadata did not
change would get the same metadata again. Whatever the incremental walk cannot do (a value in a
fake mode other than the graph's, an operation FakeTensorProp refuses) falls back to propagating
the whole graph (:func:`kopt.fx.graph_utils.refresh_meta`), as does ``KOPT_CHECK_META=1``, which
also compares the two and raises on any difference (for tests of new passes).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from kopt.fx.graph_utils import refresh_meta
from kopt.fx.symbolic import allowing_real_constants, fake_mode_of, has_shape_env, is_symbolic

Signatures = dict[torch.fx.Node, tuple[Any, ...]]
_PLAIN = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format})


class _Same:
    """Equal to another only when both hold the very same object (a constant; held, so its id
    cannot be reused while the signature lives)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


def _leaf(value: object) -> object:
    kind = type(value)
    if kind is torch.fx.Node:
        return value  # compared by identity
    if kind in _PLAIN:
        return (kind, value)
    return _Same(value)  # a SymInt, a slice, a tensor, anything else: the same object or not


def signatures(graph: torch.fx.Graph) -> Signatures:
    """What each node computes, as far as its metadata depends on it: its operation, its argument
    containers (FX never changes one in place: a pass that changes a node's arguments gives it new
    ones) and, for a constant, the tensor its name holds (a pass may set another one under it)."""
    owner = graph.owning_module
    found: Signatures = {}
    for node in graph.nodes:
        constant = _Same(getattr(owner, str(node.target), None)) if node.op == "get_attr" else None
        found[node] = (node.op, node.target, _Same(node.args), _Same(node.kwargs), constant)
    return found


def _metadata(value: object) -> object:
    """What users of a node see of its value: per tensor, shape, strides, dtype, device (as text:
    comparing symbolic sizes must not add guards) and a constant FakeTensor's value."""
    def one(leaf: object) -> object:
        if isinstance(leaf, torch.Tensor):
            constant = getattr(leaf, "constant", None)
            return (str(tuple(leaf.shape)), str(leaf.stride()) if leaf.layout == torch.strided else None,
                    leaf.dtype, str(leaf.device), None if constant is None else ("constant", id(constant)))
        if isinstance(leaf, torch.SymInt | torch.SymFloat | torch.SymBool):
            return ("sym", str(leaf))
        return _leaf(leaf)

    return tuple(one(leaf) for leaf in pytree.tree_leaves(value))  # a list or an FX immutable_list alike


class _Stale(Exception):
    """The incremental walk cannot continue: propagate the whole graph instead."""


def _recompute(graph_module: torch.fx.GraphModule, before: Signatures) -> int:
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    fakes = [n.meta.get("val") for n in placeholders]
    mode = fake_mode_of(fakes)
    if mode is None or any(n.meta.get("val") is None for n in placeholders):
        raise _Stale("placeholders without FakeTensors")
    now = signatures(graph_module.graph)
    prop = FakeTensorProp(graph_module, mode)
    changed: set[torch.fx.Node] = set()
    recomputed = 0
    symbolic = any(is_symbolic(v) for v in fakes) and has_shape_env(mode)
    context = allowing_real_constants(mode) if symbolic else mode
    with context:
        for node in graph_module.graph.nodes:
            if node.op == "placeholder":
                continue
            # the output's value is the graph's outputs, as a whole-graph propagation records them
            dirty = (node.op == "output" or node not in before or before[node] != now[node]
                     or "val" not in node.meta or any(i in changed for i in node.all_input_nodes))
            if not dirty:
                continue
            for source in node.all_input_nodes:
                if "val" not in source.meta:
                    raise _Stale(f"{source} has no metadata")
                prop.env[source] = source.meta["val"]
            old = node.meta.get("val")
            try:
                prop.run_node(node)
            except Exception as error:  # noqa: BLE001 - whatever it is, the whole-graph propagation decides
                raise _Stale(f"{node}: {type(error).__name__}: {error}") from error
            recomputed += 1
            if "val" not in node.meta or old is None or _metadata(old) != _metadata(node.meta["val"]):
                changed.add(node)
    return recomputed


def refresh(graph_module: torch.fx.GraphModule, before: Signatures) -> int:
    """Recompute ``meta["val"]`` where the graph changed since ``before`` (:func:`signatures` taken
    before the pass); returns how many nodes were recomputed (all of them after a fallback)."""
    check = os.environ.get("KOPT_CHECK_META") == "1"
    try:
        recomputed = _recompute(graph_module, before)
    except _Stale:
        refresh_meta(graph_module)
        return len(graph_module.graph.nodes)
    if check:
        incremental = {n: _metadata(n.meta["val"]) for n in graph_module.graph.nodes if "val" in n.meta}
        refresh_meta(graph_module)
        full = {n: _metadata(n.meta["val"]) for n in graph_module.graph.nodes if "val" in n.meta}
        differ = [n for n in full if incremental.get(n) != full[n]]
        if differ:
            raise AssertionError("incremental metadata differs from a full propagation on "
                                 + "; ".join(f"{n.name}: {incremental.get(n)} != {full[n]}" for n in differ[:3]))
    return recomputed
