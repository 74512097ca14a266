"""Weights as inputs of the lowered graph: module weights read live, derived ones kept up to date.

Capture freezes every weight as a ``get_attr`` constant so that passes can concatenate, quantize
and fold them. Once the passes are done, :func:`bind_weights` turns the rewritten graph's constants
back into inputs, by kind:

* a **module weight no pass transformed** becomes an input fed the parameter itself on every call,
  as ``torch.compile`` does: any write to it, however it is made (``param.data.copy_``, a PEFT
  hot-swap, ``load_state_dict``), is what the next call reads, and nothing needs checking;
* a **derived constant** (:mod:`kopt.fx.derived`: merged, quantized, folded) becomes an input fed
  a tensor kopt owns; the module weights it was computed from are its *sources*, which
  :class:`kopt.fx.weight_guard.WeightGuard` watches, and :meth:`WeightBinding.rederive` computes
  it again in place when one of them changes (same address, so a recorded CUDA graph stays valid);
* a constant with **no module weight behind it** (a tensor created in ``forward``, a RoPE table
  folded from shapes) stays baked in: nothing can change it.

The memoized step-invariant stage (:mod:`kopt.fx.staged_program`) is derived too: the module
weights it reads are sources, and a change clears the memo. A constant whose provenance kopt
cannot tell (a user pass that attached one without :func:`kopt.fx.derived.derive`) stays baked in,
every module weight becomes a source, and a change rebuilds the graph (``rebuild_on_change``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Sequence
from typing import Any

import torch

from kopt.config import Role
from kopt.fx.derived import Derivation, derivations
from kopt.fx.shared_weights import aliased, share, unshare
from kopt.release import WeightsReleasedError, is_released


def storage_identity(tensor: object) -> tuple[Any, ...] | None:
    """The same data whatever Tensor object wraps it: storage, offset, shape, stride, dtype."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
        return None
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride(),
            tensor.dtype)


@dataclasses.dataclass
class WeightBinding:
    """How the lowered graph gets its inputs from dynamo's argument list, and what to watch.

    Attributes:
        user_indices: dynamo positions of the forward's own inputs (the graph's first inputs).
        live_positions: dynamo positions of the module weights read live (the next inputs).
        derived: (name, tensor) of each derived constant kopt passes after them.
        sources: dynamo positions of the module weights some derived value depends on.
        rebuild_on_change: a constant of unknown provenance is baked in: rebuild on any change.
        stage_reads: dynamo positions of the module weights the memoized step-invariant stage reads.
    """

    user_indices: list[int]
    live_positions: list[int]
    derived: list[tuple[str, torch.Tensor]]
    sources: list[int]
    rebuild_on_change: bool = False
    stage_reads: frozenset[int] = frozenset()
    _records: dict[str, Derivation] = dataclasses.field(default_factory=dict, repr=False)
    _weights: dict[str, int] = dataclasses.field(default_factory=dict, repr=False)  # source name -> position
    _fixed: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict, repr=False)
    _depends: dict[str, frozenset[int]] = dataclasses.field(default_factory=dict, repr=False)
    _shared: list[int] = dataclasses.field(default_factory=list, repr=False)  # positions share_storage moved

    def inputs(self, args: Sequence[Any]) -> list[Any]:
        """The lowered graph's arguments for one call."""
        return ([args[i] for i in self.user_indices] + [args[i] for i in self.live_positions]
                + [tensor for _, tensor in self.derived])

    @property
    def weight_inputs(self) -> range:
        """Positions, among :meth:`inputs`, of the weights (live and derived): static addresses."""
        start = len(self.user_indices)
        return range(start, start + len(self.live_positions) + len(self.derived))

    def depends_on(self, name: str) -> frozenset[int]:
        """Dynamo positions of the module weights derived constant ``name`` was computed from."""
        return self._depends[name]

    def share_storage(self, args: Sequence[Any], derived: Sequence[tuple[str, torch.Tensor]] | None = None) -> int:
        """Make each module weight that a stacked derived constant (of ``derived``, default: this
        binding's) holds row for row a view of those rows (:mod:`kopt.fx.shared_weights`); the
        bytes of weight storage this let go."""
        return share(self.derived if derived is None else derived, self._records, self._weights, args, self._shared)

    def unshare_storage(self, args: Sequence[Any]) -> None:
        """Undo :meth:`share_storage`: each weight it moved gets storage of its own again
        (:func:`kopt.fx.shared_weights.unshare`), for a graph that will not read the derived constants."""
        unshare(args, self._shared)
        self._shared.clear()

    def aliased(self, args: Sequence[Any], derived: Sequence[tuple[str, torch.Tensor]] | None = None) -> frozenset[int]:
        """Dynamo positions of the watched weights that only a new storage can change behind kopt's
        back (:func:`kopt.fx.shared_weights.aliased`)."""
        if self.rebuild_on_change:
            return frozenset()
        return aliased(self.derived if derived is None else derived, self._records, self._weights, self._depends,
                       self.stage_reads, args)

    def recipe(self, name: str, args: Sequence[Any]) -> tuple[Any, ...]:
        """What derived constant ``name`` is, whichever graph made it: its computation, its shape and
        dtype, and down to the module weights (by object) what it reads. Two graphs of one block (a
        recompilation) give equal recipes for constants made the same way from the same weights."""
        if name in self._weights:
            return ("weight", id(args[self._weights[name]]))
        if name in self._fixed:
            value = self._fixed[name]  # traced from the forward: the same in every graph of the block
            return ("fixed", tuple(value.shape), value.dtype, float(value.detach().double().sum()))
        record = self._records[name]
        tensor = dict(self.derived).get(name)
        like = (tuple(tensor.shape), tensor.dtype) if tensor is not None else ()
        return ("derived", _describe(record.compute), record.output, like,
                tuple(self.recipe(source, args) for source in record.sources))

    def rederive(self, args: Sequence[Any], changed: Sequence[int] | None = None) -> int:
        """Compute again, in place, each derived constant that depends on a ``changed`` weight
        (all of them for None); returns how many were refreshed."""
        stale = None if changed is None else set(changed)
        names = [name for name, _ in self.derived if stale is None or self._depends[name] & stale]
        values = self._compute(args, names)
        with torch.no_grad():
            for name, tensor in self.derived:
                if name in values:
                    tensor.copy_(values[name])
        return len(values)

    def fresh(self, args: Sequence[Any]) -> list[tuple[str, torch.Tensor]]:
        """Every derived constant computed from the weights in ``args``, in new tensors (another
        module's weights through the same graph: a repeated block, see :mod:`kopt.weight_sets`)."""
        values = self._compute(args, [name for name, _ in self.derived])
        sources = {args[p].untyped_storage().data_ptr() for p in self.sources}
        return [(name, values[name].clone() if values[name].untyped_storage().data_ptr() in sources else values[name])
                for name, _ in self.derived]

    def _compute(self, args: Sequence[Any], names: Sequence[str]) -> dict[str, torch.Tensor]:
        values: dict[str, torch.Tensor] = {}
        results: dict[tuple[int, tuple[str, ...]], Any] = {}

        def value(name: str) -> torch.Tensor:
            if name in self._weights:
                tensor = args[self._weights[name]]
                if is_released(tensor):
                    raise WeightsReleasedError(
                        f"a weight that {name} depends on changed, and recomputing it needs another weight that "
                        "release_weights freed (on by default with regional fp8); compile with "
                        "release_weights=False to change weights later")
                return tensor
            if name in self._fixed:
                return self._fixed[name]
            if name not in values:
                record = self._records[name]
                key = (id(record.compute), record.sources)
                if key not in results:
                    results[key] = record.compute(*[value(source) for source in record.sources])
                result = results[key]
                values[name] = result if record.output is None else result[record.output]
            return values[name]

        with torch.no_grad():
            return {name: value(name) for name in names}


def _describe(compute: Any) -> tuple[Any, ...]:
    """A computation by what it runs: a function by module and name, a partial with its arguments."""
    if isinstance(compute, functools.partial):
        return (_describe(compute.func), repr(compute.args), repr(sorted(compute.keywords.items())))
    return (getattr(compute, "__module__", None), getattr(compute, "__qualname__", type(compute).__qualname__))


def _dependencies(records: dict[str, Derivation], weights: dict[str, int]) -> dict[str, frozenset[int]]:
    depends: dict[str, frozenset[int]] = {}

    def of(name: str) -> frozenset[int]:
        if name in weights:
            return frozenset({weights[name]})
        if name not in records:
            return frozenset()
        if name not in depends:
            depends[name] = frozenset().union(*[of(source) for source in records[name].sources])
        return depends[name]

    for name in records:
        of(name)
    return depends


def _new_placeholder(graph: torch.fx.Graph, after: torch.fx.Node | None, name: str,
                     like: torch.fx.Node, source: str) -> torch.fx.Node:
    context = graph.inserting_after(after) if after is not None else graph.inserting_before(None)
    with context:
        node = graph.placeholder(name)
    node.meta.update({k: v for k, v in like.meta.items() if k in ("val", "tensor_meta")})
    node.meta["kopt_role"] = Role.CONSTANT
    node.meta["kopt_source"] = source
    return node


def bind_weights(graph_module: torch.fx.GraphModule, example_inputs: Sequence[Any], user_indices: Sequence[int],
                 weight_positions: Sequence[int], sources: Sequence[str], traced: Collection[str],
                 hoisted: Sequence[str] = ()) -> WeightBinding:
    """Turn the rewritten graph's weight constants into inputs (see the module docstring).

    Args:
        graph_module: the rewritten graph (changed in place).
        example_inputs: dynamo's argument list.
        user_indices: dynamo positions of the graph's current inputs.
        weight_positions: dynamo positions of the module weights capture froze.
        sources: dynamo's source name of every input (to name the new inputs).
        traced: the constants the graph had right after capture (module weights, and tensors the
            forward created); any other constant not recorded as derived is of unknown provenance.
        hoisted: names of the values the step-invariant stage returns (its memo depends on them).
    """
    records = dict(derivations(graph_module))
    by_identity: dict[Any, int] = {}
    for position in weight_positions:
        by_identity.setdefault(storage_identity(example_inputs[position]), position)
    get_attrs = [n for n in graph_module.graph.nodes if n.op == "get_attr"]
    names = {str(n.target) for n in get_attrs} | {s for r in records.values() for s in r.sources}
    weights: dict[str, int] = {}
    fixed: dict[str, torch.Tensor] = {}
    unknown = []
    for name in sorted(names - set(records)):
        value = getattr(graph_module, name, None)
        position = by_identity.get(storage_identity(value))
        if position is not None:
            weights[name] = position
        elif name in traced and isinstance(value, torch.Tensor):
            fixed[name] = value  # traced from the forward itself, not a module weight: never changes
        else:
            unknown.append(name)
    depends = _dependencies(records, weights)

    graph = graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    last = placeholders[-1] if placeholders else None
    live: dict[int, torch.fx.Node] = {}
    derived: dict[str, torch.fx.Node] = {}
    derived_tensors: list[tuple[str, torch.Tensor]] = []
    for node in get_attrs:  # live weights first, then derived constants: the order of inputs()
        name = str(node.target)
        if name in weights:
            position = weights[name]
            if position not in live:
                live[position] = last = _new_placeholder(graph, last, f"weight_{position}", node, sources[position])
            node.replace_all_uses_with(live[position])
            graph.erase_node(node)
    for node in get_attrs:
        name = str(node.target)
        if name in records and depends[name]:
            if name not in derived:
                derived[name] = last = _new_placeholder(graph, last, f"derived{name}", node, name)
                derived_tensors.append((name, getattr(graph_module, name)))
            node.replace_all_uses_with(derived[name])
            graph.erase_node(node)
    still_read = {n.target for n in graph.nodes if n.op == "get_attr"}
    for name in weights:  # the module holds them: the graph module must not keep old storage alive
        if hasattr(graph_module, name) and name not in still_read:
            delattr(graph_module, name)
    graph_module.recompile()

    watched: set[int] = set()
    for name, _ in derived_tensors:
        watched |= depends[name]
    stage_reads = frozenset(_read_by_stage(graph_module, hoisted, live, derived, depends))
    watched |= stage_reads
    if unknown:  # baked in, or behind a derived constant: which weights it came from is not known
        watched |= set(weight_positions)
    return WeightBinding(list(user_indices), list(live), derived_tensors, sorted(watched), bool(unknown),
                         stage_reads, records, weights, fixed, depends)


def _read_by_stage(graph_module: torch.fx.GraphModule, hoisted: Sequence[str], live: dict[int, torch.fx.Node],
                   derived: dict[str, torch.fx.Node], depends: dict[str, frozenset[int]]) -> set[int]:
    """Module weights the hoisted (memoized) stage reads, directly or through derived constants."""
    by_name = {n.name: n for n in graph_module.graph.nodes}
    cone: set[torch.fx.Node] = set()
    stack = [by_name[name] for name in hoisted if name in by_name]
    while stack:
        node = stack.pop()
        if node not in cone:
            cone.add(node)
            stack.extend(node.all_input_nodes)
    read = {position for position, node in live.items() if node in cone}
    for name, node in derived.items():
        if node in cone:
            read |= depends[name]
    return read
