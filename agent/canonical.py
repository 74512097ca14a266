"""The canonical form of a region graph: one spelling for every way the same subgraph can be built.

Two captures of the same computation differ in node names, in the order of independent nodes, in
the order the extraction happened to list inputs and outputs, and in the argument order of
commutative ops. The canonical form removes each of those:

* every node gets an *upward hash* from its op, its literal arguments and its operands' hashes
  (an input's hash is its dtype, shape and layout), so a hash names what a value computes, not
  where it sits;
* outputs are ordered by hash; the two operands of a commutative op (``add``, ``mul``, ``maximum``,
  ... without ``alpha``) are ordered by hash: IEEE addition and multiplication are commutative, so
  the swap changes no bit of the result;
* nodes are numbered in depth-first post-order from the ordered outputs, operands left to right,
  so inputs are numbered by first use and independent nodes by data flow, never by graph order.

Binding-time roles are left out: whether the shift of a modulation is per-call (FLUX.1 feeds it the
pooled text embedding) or step-invariant (Wan) is a fact about the model around the region, not
about what the region computes. A candidate that relies on an input being constant says so itself
(:attr:`kopt.agent.candidate.Candidate.constant_inputs`).

The canonical text lists the inputs and one line per node; it *is* the graph, so equal texts mean
the same computation (a hash of it can only collide through SHA-256). A symmetric region built two
ways can in rare cases get two texts (a missed match, never a false one).
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator

import torch

from kopt.agent.schema_args import is_size_argument, op_name
from kopt.agent.sizes import SizeSymbols

aten = torch.ops.aten
COMMUTATIVE = frozenset({aten.add.Tensor, aten.mul.Tensor, aten.maximum.default, aten.minimum.default,
                         aten.eq.Tensor, aten.ne.Tensor, aten.logical_and.default, aten.logical_or.default,
                         aten.bitwise_and.Tensor, aten.bitwise_or.Tensor, aten.bitwise_xor.Tensor})
_DTYPE_SHORT = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
                torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
                torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128"}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_SHORT.get(dtype, str(dtype).removeprefix("torch."))


def is_contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for size, step in reversed(list(zip(shape, stride, strict=True))):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True


def stride_order(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...]:
    """Dims from outermost to innermost in memory (size-1 dims keep their place): a layout without sizes."""
    return tuple(sorted(range(len(shape)), key=lambda d: (-stride[d] if shape[d] != 1 else 0, d)))


def _value(node: torch.fx.Node) -> torch.Tensor:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{node.name} has no tensor meta['val']")
    return value


def _input_spec_text(node: torch.fx.Node, symbols: SizeSymbols | None) -> str:
    value = _value(node)
    shape, stride = tuple(int(d) for d in value.shape), tuple(int(s) for s in value.stride())
    dims = ", ".join(symbols.render(d) if symbols else str(d) for d in shape)
    layout = ""
    if not is_contiguous(shape, stride):
        layout = f" order={stride_order(shape, stride)}" if symbols else f" stride={stride}"
    return f"{dtype_name(value.dtype)}[{dims}]{layout}"


def constant_text(value: torch.Tensor) -> str:
    """A small constant tensor's dtype, shape and exact values (``float.hex``: no rounding in the key)."""
    flat = value.detach().cpu().reshape(-1)
    items = [float(v).hex() if value.is_floating_point() else repr(v) for v in flat.tolist()]
    return f"{dtype_name(value.dtype)}{list(value.shape)} {' '.join(items)}"


def render_literal(value: object, name_of, symbols: SizeSymbols | None = None, sized: bool = False) -> str:
    """A non-tensor argument as text; nodes through ``name_of``; sizes symbolic when ``symbols`` is given
    and the argument is a ``SymInt`` one (``sized``). Devices are left out: a region is device-free."""
    if isinstance(value, torch.fx.Node):
        return name_of(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(render_literal(v, name_of, symbols, sized) for v in value)
        return f"[{inner}]"
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return symbols.render(value) if (symbols is not None and sized) else repr(value)
    if isinstance(value, float):
        return repr(value)  # 'nan', 'inf' and exact round-trip decimals
    if isinstance(value, torch.device):
        return "<device>"
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return str(value)
    if isinstance(value, str):
        return repr(value)
    raise TypeError(f"cannot key a region on an argument of type {type(value).__name__}: {value!r}")


def _call_text(node: torch.fx.Node, name_of, symbols: SizeSymbols | None) -> str:
    args = [render_literal(a, name_of, symbols, is_size_argument(node.target, i, None))
            for i, a in enumerate(node.args)]
    kwargs = [f"{k}={render_literal(v, name_of, symbols, is_size_argument(node.target, None, k))}"
              for k, v in sorted(node.kwargs.items()) if not isinstance(v, torch.device)]
    return f"{op_name(node.target)}({', '.join(args + kwargs)})"


def ordered_args(node: torch.fx.Node, hashes: dict[torch.fx.Node, tuple[str, str]]) -> tuple:
    """``node.args``, with the two tensor operands of a commutative op sorted by upward hash."""
    args = tuple(node.args)
    swappable = (node.target in COMMUTATIVE and len(args) == 2 and node.kwargs.get("alpha", 1) == 1
                 and all(isinstance(a, torch.fx.Node) for a in args))
    if swappable and hashes[args[1]] < hashes[args[0]]:
        return (args[1], args[0])
    return args


Hashes = dict[torch.fx.Node, tuple[str, str]]


def upward_hashes(graph: torch.fx.Graph) -> Hashes:
    """Per node, a pair of hashes of what it computes from inputs known by dtype, rank, broadcast
    pattern and layout: first without sizes, then with them. Orders compare the size-free hash
    first, so the canonical order (and with it the class key) is the same at every size."""
    hashes: Hashes = {}
    for node in graph.nodes:
        if node.op not in ("placeholder", "get_attr", "call_function"):
            continue
        pair = []
        for sized in (False, True):
            if node.op == "placeholder":
                text = "in " + _input_spec_text(node, None if sized else _SIZE_FREE)
            elif node.op == "get_attr":
                text = "const " + constant_text(node.meta["kopt_constant"])
            else:
                text = _call_text_with(node, hashes, sized)
            pair.append(hashlib.sha256(text.encode()).hexdigest())
        hashes[node] = (pair[0], pair[1])
    return hashes


def _call_text_with(node: torch.fx.Node, hashes: Hashes, sized: bool) -> str:
    def name_of(n: torch.fx.Node) -> str:
        return hashes[n][1 if sized else 0]

    symbols = None if sized else _SIZE_FREE
    args = [render_literal(a, name_of, symbols, is_size_argument(node.target, i, None))
            for i, a in enumerate(ordered_args(node, hashes))]
    kwargs = [f"{k}={render_literal(v, name_of, symbols, is_size_argument(node.target, None, k))}"
              for k, v in sorted(node.kwargs.items()) if not isinstance(v, torch.device)]
    return f"{op_name(node.target)}({', '.join(args + kwargs)})"


class _SizeFree(SizeSymbols):
    """Renders every size above 1 as ``s``: the upward hash sees broadcasting, not sizes."""

    def render(self, size: int) -> str:
        return "s" if size > 1 else str(size)


_SIZE_FREE = _SizeFree(())


def _operands(node: torch.fx.Node, hashes: Hashes) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []

    def collect(value: object) -> None:
        if isinstance(value, torch.fx.Node):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                collect(item)

    for arg in ordered_args(node, hashes):
        collect(arg)
    for _, value in sorted(node.kwargs.items()):
        collect(value)
    return found


def post_order(outputs: list[torch.fx.Node], hashes: Hashes) -> list[torch.fx.Node]:
    """Nodes reachable from ``outputs`` in depth-first post-order, operands left to right (iterative:
    a region may be a long chain)."""
    order: list[torch.fx.Node] = []
    done: set[torch.fx.Node] = set()
    for root in outputs:
        stack: list[tuple[torch.fx.Node, bool]] = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node in done:
                continue
            if expanded:
                done.add(node)
                order.append(node)
                continue
            stack.append((node, True))
            for operand in reversed(_operands(node, hashes)):
                if operand not in done:
                    stack.append((operand, False))
    return order


@dataclasses.dataclass(frozen=True)
class CanonicalText:
    """The canonical text with literal shapes (``exact``) and with symbolic sizes (``by_class``)."""

    exact: str
    by_class: str


def canonical_text(graph: torch.fx.Graph) -> CanonicalText:
    """The texts of a graph that is already canonical (built by :func:`kopt.agent.region.canonicalize`)."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    symbols = SizeSymbols.of(tuple(int(d) for d in _value(n).shape) for n in placeholders)
    texts = []
    for sym in (None, symbols):
        lines = [f"{n.name}: {_input_spec_text(n, sym)}" for n in placeholders]
        for node in graph.nodes:
            if node.op == "get_attr":
                lines.append(f"{node.name} = const {constant_text(node.meta['kopt_constant'])}")
            elif node.op == "call_function":
                if node.target is operator.getitem:
                    lines.append(f"{node.name} = {node.args[0].name}[{node.args[1]}]")
                else:
                    lines.append(f"{node.name} = {_call_text(node, lambda n: n.name, sym)}")
            elif node.op == "output":
                lines.append(f"return {render_literal(node.args[0], lambda n: n.name)}")
        texts.append("\n".join(lines))
    return CanonicalText(texts[0], texts[1])
