"""Small graph helpers shared by every pass: replace with provenance, op census, meta refresh."""

from __future__ import annotations

import collections
import operator
from collections.abc import Callable, Iterable

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from kopt.fx.symbolic import allowing_real_constants, fake_mode_of, has_shape_env, is_symbolic, static_int

PROVENANCE = "kopt_provenance"


# Ops that only reinterpret a tensor's shape (same elements, same order): a matcher looks through them.
RESHAPES = frozenset({torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.reshape.default})


def is_reshape(node: object) -> bool:
    """A view/_unsafe_view/reshape node (the value behind it, reshaped)."""
    return isinstance(node, torch.fx.Node) and node.target in RESHAPES


def calls(node: object, *targets: object) -> bool:
    """``node`` is an FX node calling one of ``targets``."""
    return isinstance(node, torch.fx.Node) and node.target in targets


def swaps_dims_1_and_2(node: object) -> bool:
    """``node`` is ``permute(x, [0, 2, 1, 3])`` or ``transpose(x, 1, 2)`` of a 4-D ``x``: the
    (B, H, S, D) ↔ (B, S, H, D) move that attention inputs and outputs go through."""
    if calls(node, torch.ops.aten.permute.default):
        return list(node.args[1]) == [0, 2, 1, 3]
    return calls(node, torch.ops.aten.transpose.int) and sorted(d % 4 for d in node.args[1:3]) == [1, 2]


def op_name(node: torch.fx.Node) -> str:
    """A short stable name for what a node computes (``aten.mm``, ``getitem``, ``placeholder``)."""
    if node.op != "call_function":
        return node.op
    target = node.target
    overload = getattr(target, "overloadpacket", None)
    if overload is not None:
        return f"{overload._qualified_op_name.replace('::', '.')}"
    return getattr(target, "__name__", str(target))


def op_kind(node: torch.fx.Node) -> str:
    """Coarse class of a node for the report: gemm, attention, norm, view, copy, elementwise, ..."""
    name = op_name(node)
    if node.op != "call_function":
        return node.op
    short = name.split(".")[-1]
    if short in {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm"}:
        return "gemm"
    if "attention" in short:
        return "attention"
    if "norm" in short:
        return "norm"
    if short in {"view", "_unsafe_view", "reshape", "permute", "t", "transpose", "expand", "unsqueeze",
                 "squeeze", "slice", "select", "split", "split_with_sizes", "unbind", "getitem",
                 "view_as_complex", "view_as_real", "alias", "chunk"}:
        return "view"
    if short in {"cat", "stack", "clone", "_to_copy", "copy", "contiguous", "index_select", "gather"}:
        return "copy"
    if name.startswith("kopt."):
        return "kopt"
    return "elementwise/other"


def census(graph: torch.fx.Graph) -> dict[str, int]:
    """Node counts by kind (``op_kind``), plus ``nodes`` for the total."""
    counts = collections.Counter(op_kind(n) for n in graph.nodes)
    counts["nodes"] = len(graph.nodes)
    return dict(sorted(counts.items()))


def replace(node: torch.fx.Node, new: torch.fx.Node, *, pass_name: str, rule: str) -> None:
    """Replace every use of ``node`` by ``new``, stamping provenance and keeping the old metadata.

    ``new`` stands for the same value, so it inherits ``node``'s FakeTensor (``meta["val"]``) when it
    has none (a fresh ``getitem`` of a fused op): later matches read shapes from it, and without it a
    rewrite would hide its outputs from the next rewrite (a chain of blocks fused every other block)."""
    for key in ("stack_trace", "nn_module_stack", "source_fn_stack", "val"):
        if key in node.meta and key not in new.meta:
            new.meta[key] = node.meta[key]
    stamp(new, pass_name=pass_name, rule=rule)
    node.replace_all_uses_with(new)


def stamp(node: torch.fx.Node, *, pass_name: str, rule: str) -> None:
    """Record which pass and rule created ``node`` (kept by later passes, shown by ``kopt explain``)."""
    node.meta.setdefault(PROVENANCE, []).append(f"{pass_name}:{rule}")


def refresh_meta(graph_module: torch.fx.GraphModule, example_fakes: Iterable[object] | None = None) -> None:
    """Recompute ``meta["val"]`` on every node with FakeTensor propagation (shapes after a rewrite).

    A graph with symbolic sizes is propagated in the FakeTensorMode its inputs belong to (dynamo's,
    whose ShapeEnv knows the symbols), with those very fakes; a static one in a fresh mode."""
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    if example_fakes is None:
        example_fakes = [n.meta["val"] for n in placeholders]
    example_fakes = list(example_fakes)
    mode = fake_mode_of(example_fakes)
    if any(is_symbolic(v) for v in example_fakes) and has_shape_env(mode):
        with allowing_real_constants(mode):  # type: ignore[arg-type]
            FakeTensorProp(graph_module, mode).propagate_dont_convert_inputs(*example_fakes)
        return
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    inputs = [mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in example_fakes]
    FakeTensorProp(graph_module, mode).propagate_dont_convert_inputs(*inputs)


def missing_meta(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """Nodes without FakeTensor metadata (a lint used between passes in tests)."""
    return [n for n in graph.nodes if n.op != "output" and "val" not in n.meta]


def meta_value(node: object) -> torch.Tensor | None:
    """The FakeTensor a node carries in ``meta["val"]``, or None (non-nodes, multi-output nodes)."""
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def only_user(node: torch.fx.Node, target: object = None) -> torch.fx.Node | None:
    """The single user of ``node`` (calling ``target``, when given), or None."""
    users = list(node.users)
    if len(users) != 1 or (target is not None and users[0].target is not target):
        return None
    return users[0]


def size_arg(graph: torch.fx.Graph, node: torch.fx.Node, dim: int) -> object:
    """``node``'s size along ``dim`` as a node argument: the int when it is static, else a
    ``sym_size`` node (a SymInt object must never be baked into a node's arguments: the graph would
    hold the size of the call it was traced on)."""
    size = meta_value(node).shape[dim]  # type: ignore[union-attr]
    fixed = static_int(size)
    if fixed is not None:
        return fixed
    return graph.call_function(torch.ops.aten.sym_size.int, (node, dim))


def add_sizes(graph: torch.fx.Graph, a: object, b: object) -> object:
    """``a + b`` for sizes given as ints or SymInt-valued nodes (an int when both are ints)."""
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if a == 0:
        return b
    return graph.call_function(operator.add, (a, b))


def pure_key(node: torch.fx.Node, arg_key: Callable[[torch.fx.Node], object] | None = None) -> object:
    """A hashable key equal for two nodes that compute the same value when they are pure: the
    constant a ``get_attr`` reads, else the target and the arguments (node arguments by identity, or
    by ``arg_key``, to compare chains of nodes by structure). Floats keep -0.0 and nan distinct."""
    if node.op == "get_attr":
        return ("get_attr", node.target)

    def freeze(value: object) -> object:
        if isinstance(value, (list, tuple)):
            return (type(value).__name__, tuple(freeze(v) for v in value))
        if isinstance(value, dict):
            return tuple(sorted((k, freeze(v)) for k, v in value.items()))
        if isinstance(value, torch.fx.Node):
            return ("node", id(value)) if arg_key is None else arg_key(value)
        if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return str(value)
        if isinstance(value, float):
            return ("float", repr(value))
        return value

    return (node.target, freeze(node.args), freeze(node.kwargs))


def hoistable(values: Iterable[object], anchor: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The nodes computing ``values`` that come after ``anchor``, in graph order: what must move up
    for ``values`` to exist right before ``anchor``; None when one of them is ``anchor``, depends on
    it, or has effects (it cannot move). Valid because a pure node computes the same value wherever
    it runs once its inputs exist, and the nodes returned are moved in dependency order."""
    order = {node: i for i, node in enumerate(anchor.graph.nodes)}
    cone, stack = set(), [v for v in values if isinstance(v, torch.fx.Node)]
    while stack:
        node = stack.pop()
        if node in cone or order[node] < order[anchor]:
            continue
        if node is anchor or node.op not in ("call_function", "get_attr") or node.is_impure():
            return None
        cone.add(node)
        stack.extend(node.all_input_nodes)
    return sorted(cone, key=order.__getitem__)
