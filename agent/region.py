"""A region: a small FX subgraph of a captured kopt graph, cut out with typed inputs and outputs.

The agent optimizes regions, not whole models: a region is what one candidate replaces, what the
verifier runs against, and what the knowledge base keys its findings on. :func:`extract` cuts a set
of nodes out of a functional ATen graph (every node carries a FakeTensor ``meta["val"]``, see
:mod:`kopt.fx.capture`): the values they read from outside become inputs, the values read outside
become outputs. Weights read through ``get_attr`` become inputs with the ``constant`` role (their
values are the model's, not the region's: one region occurs with many weights); tiny constants
(at most :data:`INLINE_CONSTANT_NUMEL` elements, e.g. the ``1000.0`` of a timestep scale) stay in
the region, because their values are part of what it computes.

The region is stored in canonical form (:mod:`kopt.agent.canonical`), so its inputs and outputs
are in an order that does not depend on how it was found: a candidate written for one occurrence
fits every other occurrence with the same :attr:`Region.signature`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from kopt.agent.canonical import CanonicalText, canonical_text, ordered_args, post_order, upward_hashes
from kopt.config import Role
from kopt.fx.binding_time import binding_times
from kopt.fx.constants import constant_value

INLINE_CONSTANT_NUMEL = 16
_TUPLE_VALUED = (torch.ops.aten.var_mean.correction, torch.ops.aten.native_layer_norm.default)
# Value-preserving wrappers that tracing inserts around constants (``lift_fresh_copy``) and autograd
# boundaries (``detach``); in an inference region they change nothing, and tracing a region's own
# source adds them again in another arrangement, so the canonical form leaves them out.
_TRANSPARENT = (torch.ops.aten.detach.default, torch.ops.aten.lift_fresh_copy.default)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape, dtype, strides and binding-time role of one region input or output."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...]
    role: Role = Role.PER_CALL

    @staticmethod
    def of(value: torch.Tensor, role: Role = Role.PER_CALL) -> TensorSpec:
        return TensorSpec(tuple(int(d) for d in value.shape), value.dtype, tuple(int(s) for s in value.stride()),
                          role)

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    def to_dict(self) -> dict:
        return {"shape": list(self.shape), "dtype": str(self.dtype).removeprefix("torch."),
                "stride": list(self.stride), "role": self.role.value}

    @staticmethod
    def from_dict(data: Mapping) -> TensorSpec:
        return TensorSpec(tuple(data["shape"]), getattr(torch, data["dtype"]), tuple(data["stride"]),
                          Role(data["role"]))


@dataclasses.dataclass(frozen=True, eq=False)
class Region:
    """A canonical region graph and its typed interface; equal when their signatures are equal.

    Attributes:
        graph_module: the canonical graph: placeholders ``in0..``, small constants ``c0..`` and
            values ``v0..`` in canonical order, FakeTensor ``meta["val"]`` on every node.
        inputs, outputs: one spec per placeholder / returned value, in canonical order.
        text: the canonical texts the keys are hashes of.
        model: where the region was first seen (free text, e.g. a workload name), or None.
        input_nodes, output_nodes: the nodes of the source graph behind each input and output, in
            canonical order (what a rewrite replaces); empty for regions not cut from a graph.
    """

    graph_module: torch.fx.GraphModule
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    text: CanonicalText
    model: str | None = None
    input_nodes: tuple[torch.fx.Node, ...] = ()
    output_nodes: tuple[torch.fx.Node, ...] = ()

    @property
    def signature(self) -> str:
        """SHA-256 of the canonical text with literal shapes: the same computation on the same
        shapes, dtypes and layouts, in any model."""
        return hashlib.sha256(self.text.exact.encode()).hexdigest()

    @property
    def class_key(self) -> str:
        """SHA-256 of the canonical text with symbolic sizes: the same computation at any sizes (ranks,
        dtypes and broadcasting still count), for lessons that transfer across shapes."""
        return hashlib.sha256(self.text.by_class.encode()).hexdigest()

    @property
    def source(self) -> str:
        """Python source of a function ``region(in0, ...)`` computing the region with ATen ops."""
        from kopt.agent.region_source import render_source

        return render_source(self.graph_module.graph)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Region) and other.signature == self.signature

    def __hash__(self) -> int:
        return hash(self.signature)

    def __repr__(self) -> str:
        ops = sum(1 for n in self.graph_module.graph.nodes if n.op == "call_function")
        return f"<Region {self.signature[:12]} class {self.class_key[:12]}: {ops} ops, {len(self.inputs)} in, " \
               f"{len(self.outputs)} out>"


def _tensor(node: torch.fx.Node) -> torch.Tensor:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{node.name} has no tensor meta['val'] (regions read and write tensors only)")
    return value


def _members_with_getitems(nodes: Iterable[torch.fx.Node]) -> list[torch.fx.Node]:
    members = list(dict.fromkeys(nodes))
    for node in list(members):
        if node.target in _TUPLE_VALUED:
            members += [u for u in node.users if u.target is operator.getitem and u not in members]
    return members


def _check_member(node: torch.fx.Node) -> None:
    if node.op != "call_function":
        raise ValueError(f"{node.name} is a {node.op} node; a region holds call_function nodes only")
    if node.target is not operator.getitem and not isinstance(node.target, torch._ops.OpOverload):
        raise ValueError(f"{node.name} calls {node.target!r}, not an ATen-style op overload")


def extract(graph_module: torch.fx.GraphModule, nodes: Iterable[torch.fx.Node],
            outputs: Sequence[torch.fx.Node] | None = None, *, model: str | None = None) -> Region:
    """Cut ``nodes`` out of ``graph_module`` as a canonical :class:`Region`.

    Getitems of a tuple-valued member (``var_mean``, layer norm) join it. Outputs are ``outputs`` if
    given, else every member read by a node outside the region. Raises ValueError with the reason
    when the nodes are not a region (a non-call node, a value without tensor metadata)."""
    members = _members_with_getitems(nodes)
    if not members:
        raise ValueError("empty region")
    for node in members:
        _check_member(node)
    member_set = set(members)
    order = {n: i for i, n in enumerate(graph_module.graph.nodes)}
    members.sort(key=order.__getitem__)
    if outputs is None:
        outputs = [n for n in members if n.target not in _TUPLE_VALUED and any(u not in member_set for u in n.users)]
    if not outputs:
        raise ValueError("nothing outside the region reads it; name its outputs")
    roles = binding_times(graph_module.graph)

    raw = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    holder = torch.nn.Module()
    for node in members:
        for arg in node.all_input_nodes:
            if arg in member_set or arg in env:
                continue
            value = constant_value(arg)
            if value is not None and value.numel() <= INLINE_CONSTANT_NUMEL:
                env[arg] = _constant_node(raw, holder, value, _tensor(arg))
            else:
                env[arg] = _placeholder(raw, arg, roles.get(arg, Role.PER_CALL))
    for node in members:
        if node.target in _TRANSPARENT and isinstance(node.args[0], torch.fx.Node):
            env[node] = env[node.args[0]]
        else:
            env[node] = raw.node_copy(node, env.__getitem__)
    for node in outputs:
        _tensor(node)
    raw.output(tuple(env[n] for n in outputs))
    originals = {v: k for k, v in env.items() if k not in member_set}  # raw input -> the node it stands for
    return _canonical_region(torch.fx.GraphModule(holder, raw), model, originals, list(outputs))


def _placeholder(graph: torch.fx.Graph, source: torch.fx.Node, role: Role) -> torch.fx.Node:
    node = graph.placeholder(f"input_{len(graph.nodes)}")
    node.meta["val"] = _tensor(source)
    node.meta["kopt_role"] = role
    return node


def _constant_node(graph: torch.fx.Graph, holder: torch.nn.Module, value: torch.Tensor,
                   fake: torch.Tensor) -> torch.fx.Node:
    name = f"const_{len(graph.nodes)}"
    holder.register_buffer(name, value.detach().clone(), persistent=False)
    node = graph.get_attr(name)
    node.meta["val"] = fake
    node.meta["kopt_constant"] = value.detach().cpu().clone()
    return node


def canonicalize(raw: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, dict[torch.fx.Node, torch.fx.Node],
                                                      list[int]]:
    """The canonical copy of a region graph, the map from each canonical node to the raw one, and
    the canonical order of the raw outputs (positions in the raw output tuple)."""
    graph = raw.graph
    hashes = upward_hashes(graph)
    output_node = next(n for n in graph.nodes if n.op == "output")
    raw_outputs = list(output_node.args[0])
    output_order = sorted(range(len(raw_outputs)), key=lambda i: hashes[raw_outputs[i]])
    outputs = [raw_outputs[i] for i in output_order]
    order = post_order(outputs, hashes)
    new, holder = torch.fx.Graph(), torch.nn.Module()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for kind, prefix in (("placeholder", "in"), ("get_attr", "c")):
        for node in (n for n in order if n.op == kind):
            name = f"{prefix}{sum(1 for n in env if n.op == kind)}"
            if kind == "placeholder":
                env[node] = new.placeholder(name)
            else:
                holder.register_buffer(name, getattr(raw, node.target), persistent=False)
                env[node] = new.get_attr(name)
            env[node].meta.update(node.meta)
    count = 0
    for node in (n for n in order if n.op == "call_function"):
        args = torch.fx.node.map_arg(ordered_args(node, hashes), env.__getitem__)
        kwargs = torch.fx.node.map_arg(dict(node.kwargs), env.__getitem__)
        env[node] = new.create_node("call_function", node.target, args, kwargs, name=f"v{count}")
        env[node].meta.update(node.meta)
        count += 1
    new.output(tuple(env[n] for n in outputs))
    return torch.fx.GraphModule(holder, new), {v: k for k, v in env.items()}, output_order


def _canonical_region(raw: torch.fx.GraphModule, model: str | None,
                      originals: Mapping[torch.fx.Node, torch.fx.Node] | None = None,
                      source_outputs: list[torch.fx.Node] | None = None) -> Region:
    module, to_raw, output_order = canonicalize(raw)
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    returned = next(n for n in module.graph.nodes if n.op == "output").args[0]
    inputs = tuple(TensorSpec.of(_tensor(n), n.meta.get("kopt_role", Role.PER_CALL)) for n in placeholders)
    outputs = tuple(TensorSpec.of(_tensor(n)) for n in returned)
    input_nodes = output_nodes = ()
    if originals is not None:
        input_nodes = tuple(originals[to_raw[n]] for n in placeholders)
        output_nodes = tuple(source_outputs[i] for i in output_order)
    return Region(module, inputs, outputs, canonical_text(module.graph), model, input_nodes, output_nodes)


def from_graph(graph_module: torch.fx.GraphModule, *, model: str | None = None) -> Region:
    """The whole of ``graph_module`` (every call node; its outputs) as a region."""
    members = [n for n in graph_module.graph.nodes if n.op == "call_function"]
    output_node = next(n for n in graph_module.graph.nodes if n.op == "output")
    returned = output_node.args[0]
    returned = list(returned) if isinstance(returned, (tuple, list)) else [returned]
    return extract(graph_module, members, returned, model=model)


def from_function(fn: Callable[..., object], *example_inputs: torch.Tensor, roles: Sequence[Role] | None = None,
                  model: str | None = None) -> Region:
    """The region a plain PyTorch function computes, traced like kopt captures a model (functional
    ATen, FakeTensor metadata); ``roles`` gives each input's binding time (default per-call)."""
    from kopt.fx.capture import trace_function

    graph_module = trace_function(fn, *example_inputs)
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    for node, role in zip(placeholders, roles or [Role.PER_CALL] * len(placeholders), strict=True):
        node.meta["kopt_role"] = role
    return from_graph(graph_module, model=model)


def from_source(source: str, inputs: Sequence[TensorSpec], *, model: str | None = None) -> Region:
    """Rebuild a region from :attr:`Region.source` and its input specs (how the knowledge base
    stores regions). Tracing the source gives back the same canonical graph, so the same signature.
    The source is checked first (:func:`kopt.agent.region_source.check_region_source`): one that does
    not have the rendered shape is refused with ValueError, since it may come from an imported file."""
    from kopt.agent.region_source import check_region_source

    problem = check_region_source(source)
    if problem:
        raise ValueError(f"not a region source: {problem}")
    namespace: dict[str, object] = {}
    exec(compile(source, "<region source>", "exec"), namespace)  # noqa: S102 - checked above: ATen calls only
    examples = [torch.empty_strided(s.shape, s.stride, dtype=s.dtype) for s in inputs]
    return from_function(namespace["region"], *examples, roles=[s.role for s in inputs], model=model)


def from_codegen(graph_module: torch.fx.GraphModule, region: object, *, model: str | None = None) -> Region:
    """The agent region of a fusible region found by :func:`kopt.codegen.search.find_regions`."""
    return extract(graph_module, region.members, region.output_nodes, model=model)


def fusible_regions(graph_module: torch.fx.GraphModule, *, model: str | None = None) -> list[Region]:
    """Every region :mod:`kopt.codegen` can fuse in a captured graph, as agent regions."""
    from kopt.codegen.search import find_regions

    return [from_codegen(graph_module, r, model=model) for r in find_regions(graph_module.graph).regions]
