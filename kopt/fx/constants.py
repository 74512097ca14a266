"""Reading and creating the constants (frozen weights) of a captured graph."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

aten = torch.ops.aten


def constant_value(node: object) -> torch.Tensor | None:
    """The tensor behind a ``get_attr`` node, or None if ``node`` is not a constant."""
    if not isinstance(node, torch.fx.Node) or node.op != "get_attr":
        return None
    value = node.graph.owning_module
    for part in str(node.target).split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) else None


def transposed_constant(node: object) -> torch.fx.Node | None:
    """``W`` if ``node`` is ``W.t()`` (or ``permute(W, [1, 0])``) of a 2-D constant, else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    if node.target is aten.t.default or (node.target is aten.permute.default and list(node.args[1]) == [1, 0]):
        source = node.args[0]
        value = constant_value(source)
        if value is not None and value.dim() == 2:
            return source  # type: ignore[return-value]
    return None


def add_constant(graph_module: torch.fx.GraphModule, stem: str, value: torch.Tensor,
                 before: torch.fx.Node) -> torch.fx.Node:
    """Attach ``value`` to the module under a fresh name and return a ``get_attr`` node for it.

    Registered as a persistent buffer: Inductor's AOTAutograd cache keys a graph by pickling its
    module's attributes, and the set of non-persistent buffer names pickles in string-hash order,
    which changes from process to process, so every new process would miss that cache."""
    index = 0
    while hasattr(graph_module, f"{stem}{index}"):
        index += 1
    name = f"{stem}{index}"
    graph_module.register_buffer(name, value)
    with graph_module.graph.inserting_before(before):
        node = graph_module.graph.get_attr(name)
    node.meta["val"] = FakeTensorMode(allow_non_fake_inputs=True).from_tensor(value)
    return node


def weight_of(gemm: torch.fx.Node) -> torch.fx.Node | None:
    """The constant ``W`` of an ``mm(x, W.T)`` / ``addmm(b, x, W.T)`` node, or None."""
    if gemm.target is aten.mm.default:
        return transposed_constant(gemm.args[1])
    if gemm.target is aten.addmm.default:
        return transposed_constant(gemm.args[2])
    return None


def weight_paths(node: torch.fx.Node | None) -> tuple[str, ...]:
    """The module paths of the parameters behind a constant (several for a merged weight);
    empty when it has none (a tensor traced as a constant, or a value kopt computed)."""
    if node is None:
        return ()
    if "kopt_params" in node.meta:
        return tuple(node.meta["kopt_params"])
    path = node.meta.get("kopt_param")
    return (path,) if path else ()


def drop_unused_constants(graph_module: torch.fx.GraphModule, prefix: str = "_kopt") -> int:
    """Delete constants kopt attached (``_kopt*``) that no ``get_attr`` reads any more; bytes freed.

    A rewrite that replaces a kopt-made constant (e.g. FP8 quantization of a merged weight) would
    otherwise keep the old tensor alive for the life of the compiled graph."""
    used = {node.target for node in graph_module.graph.nodes if node.op == "get_attr"}
    freed = 0
    for name, buffer in list(graph_module.named_buffers(recurse=False)):
        if name.startswith(prefix) and name not in used:
            freed += buffer.numel() * buffer.element_size()
            delattr(graph_module, name)
    return freed

