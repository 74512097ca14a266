"""Precision hazards: places where eager's rounding and Inductor's differ enough to move the output.

One kind so far, found by what the graph computes (never by module names):

**A low-precision value scaled into a sinusoid.** ``mul(x, c)`` whose result is bf16 or fp16 (``x`` is
a bf16 input, or a value cast to bf16), with a large constant ``|c|`` (a timestep or guidance scaled
by 1000), whose result reaches ``sin``/``cos``/``exp`` through elementwise ops and views only.
Eager rounds the product to bf16 before the sinusoid: FLUX.1's ``guidance.to(bf16) * 1000`` turns
3.5 into 3504 instead of 3500, an error of 4 in the phase of every frequency (0.34 relative error
in its time embedding). Inductor fuses the multiply into the sinusoid's kernel and computes it in
float32 without that rounding (unless ``torch._inductor.config.emulate_precision_casts=True``), so a
compiled model differs from eager there, and is the closer of the two to a higher-precision
reference. Valid because rounding ``v`` to bf16 moves it by up to half a step of ``2**(floor(log2
|v|) - 7)`` (fp16: ``- 10``), and an error ``d`` in a sinusoid's argument moves ``sin(f v)`` by up to
``f d``: with ``v`` in the thousands the step is 8 or 16, far above the sinusoid's period at its
high frequencies.

Each finding is a :class:`PrecisionHazard` (node, kind, magnitude: the largest absolute rounding
error of the product on the first call's inputs), for the report, ``kopt explain``, and the agent:
removing a hazard (computing the product in float32) is a candidate whose contract is that it moves
the output toward the reference.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence

import torch

from kopt.fx.constants import constant_value

aten = torch.ops.aten

MIN_SCALE = 64.0  # |c| from which the product's rounding step is at least 64x the source's own step
MAX_PATH = 24  # nodes searched from the product towards a sinusoid
MAX_EVAL_NODES = 200  # ancestors evaluated to measure the rounding on the first call's inputs

_LOW = {torch.bfloat16: 8, torch.float16: 11}  # dtype -> bits of significand precision
_SINKS = {aten.sin.default: "sin", aten.cos.default: "cos", aten.exp.default: "exp", aten.exp2.default: "exp2",
          aten.expm1.default: "expm1"}
_MULTIPLIES = (aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar)
_LAYOUT = {aten._to_copy.default, aten.clone.default, aten.cat.default, aten.view.default, aten._unsafe_view.default,
           aten.reshape.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default, aten.expand.default,
           aten.slice.Tensor, aten.select.int, aten.permute.default, aten.t.default, aten.transpose.int,
           aten.alias.default}


class HazardKind(str, enum.Enum):
    """What a finding is (a ``str`` so that JSON shows the value)."""

    LOW_PRECISION_SCALED_SINUSOID = "low-precision value scaled into a sinusoid"


@dataclasses.dataclass(frozen=True)
class PrecisionHazard:
    """One precision hazard in a captured graph.

    Attributes:
        node: the FX node whose result eager rounds (the multiply).
        kind: what the hazard is.
        magnitude: the largest absolute rounding error of that result on the first call's inputs
            (0.0: exact at these inputs; None: not measured).
        dtype: the low-precision dtype of the result (``bfloat16``).
        scale: the constant factor the value is multiplied by (a division by ``c`` is a factor ``1/c``).
        source: the graph input the value comes from (its dynamo source), if it is one.
        sinks: the sinusoid (or exp) nodes it reaches.
        example: (exact, rounded) for the element with the largest error.
        step: the rounding step of the dtype at that element's magnitude.
        inductor: what Inductor does with it.
    """

    node: str
    kind: HazardKind
    magnitude: float | None
    dtype: str
    scale: float
    source: str | None
    sinks: tuple[str, ...]
    example: tuple[float, float] | None
    step: float | None
    inductor: str

    def describe(self) -> str:
        where = f"{self.node} (x {self.scale:g}{f', from {self.source}' if self.source else ''})"
        if self.example is not None:
            exact, rounded = self.example
            measured = (f"{exact:.6g} -> {rounded:.6g} in {self.dtype} (error {self.magnitude:.3g}, step "
                        f"{self.step:g} at this magnitude) on the first call's inputs")
            if not self.magnitude:
                measured += f"; exact there, other values round by up to {(self.step or 0) / 2:g}"
        else:
            measured = f"rounded to {self.dtype} (not measured)"
        return (f"{self.kind.value}: {where}: {measured}; feeds {', '.join(self.sinks)}. {self.inductor}")


def _factor(node: torch.fx.Node) -> tuple[float, torch.fx.Node] | None:
    """(the constant factor, the other operand) of a multiply or divide by a scalar constant: ``x * 1000``
    gives 1000, ``x / 0.001`` gives 1000 too."""
    x, other = node.args[0], node.args[1]
    if isinstance(other, torch.fx.Node):
        value = constant_value(other)
        if value is None or value.numel() != 1:
            return None
        other = value.item()
    if not isinstance(x, torch.fx.Node) or not isinstance(other, (int, float)) or other == 0:
        return None
    return (1.0 / other if node.target in (aten.div.Tensor, aten.div.Scalar) else float(other)), x


def _low_dtype(node: torch.fx.Node) -> torch.dtype | None:
    value = node.meta.get("val")
    dtype = getattr(value, "dtype", None)
    return dtype if dtype in _LOW else None


def _passes_value(node: torch.fx.Node) -> bool:
    """An op that carries its input's value on elementwise or as a layout change (fused by Inductor)."""
    target = node.target
    return target in _LAYOUT or (isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags)


def _sinks(start: torch.fx.Node) -> list[torch.fx.Node]:
    """Sinusoids (and exps) reached from ``start`` through value-carrying ops only."""
    found, frontier, seen = [], list(start.users), {start}
    while frontier and len(seen) < MAX_PATH:
        node = frontier.pop()
        if node in seen or node.op != "call_function":
            continue
        seen.add(node)
        if node.target in _SINKS:
            found.append(node)
        elif _passes_value(node):
            frontier.extend(node.users)
    return sorted(found, key=lambda n: n.name)


def _source(node: torch.fx.Node) -> str | None:
    """The graph input behind ``node`` through casts and views (its dynamo source), if any."""
    while node.op == "call_function" and node.target in _LAYOUT:
        node = node.args[0]  # type: ignore[assignment]
    if node.op == "placeholder":
        return str(node.meta.get("kopt_source") or node.name)
    return None


def _evaluate(graph_module: torch.fx.GraphModule, nodes: Sequence[torch.fx.Node],
              inputs: Sequence[object]) -> list[torch.Tensor] | None:
    """The values of ``nodes`` on ``inputs``, computing only their ancestors (None if that is costly)."""
    needed: set[torch.fx.Node] = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if node in needed:
            continue
        needed.add(node)
        stack.extend(node.all_input_nodes)
        if len(needed) > MAX_EVAL_NODES:
            return None
    graph = torch.fx.Graph()
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    for node in graph_module.graph.nodes:
        if node in needed or node.op == "placeholder":
            copies[node] = graph.node_copy(node, lambda n: copies[n])
    graph.output(tuple(copies[n] for n in nodes))
    if len(placeholders) != len(inputs):
        return None
    with torch.no_grad():
        return list(torch.fx.GraphModule(graph_module, graph)(*inputs))


def _step(value: float, bits: int) -> float:
    return 2.0 ** (math.floor(math.log2(abs(value))) - (bits - 1)) if value else 0.0


def _inductor_note() -> str:
    import torch._inductor.config as inductor_config

    if getattr(inductor_config, "emulate_precision_casts", False):
        return "Inductor rounds it as eager does (torch._inductor.config.emulate_precision_casts=True)."
    return ("Inductor fuses the multiply into the sinusoid's kernel and computes it in float32 without this "
            "rounding (unless torch._inductor.config.emulate_precision_casts=True): its output differs from "
            "eager's here and is the closer to a higher-precision reference.")


def _measure(graph_module: torch.fx.GraphModule, product: torch.fx.Node, operand: torch.fx.Node,
             inputs: Sequence[object] | None, factor: float,
             bits: int) -> tuple[float, tuple[float, float], float] | None:
    """(largest absolute rounding error, (exact, rounded) there, step there) on ``inputs``."""
    if inputs is None:
        return None
    try:
        values = _evaluate(graph_module, [operand, product], inputs)
    except Exception:  # noqa: BLE001 - measuring is a courtesy: the finding stands without it
        return None
    if values is None:
        return None
    x, rounded = (v.detach().double().flatten() for v in values)
    exact = x * factor
    if exact.numel() != rounded.numel() or exact.numel() == 0:
        return None
    errors = (exact - rounded).abs()
    worst = int(errors.argmax())
    return errors[worst].item(), (exact[worst].item(), rounded[worst].item()), _step(exact[worst].item(), bits)


def find_precision_hazards(graph_module: torch.fx.GraphModule,
                           inputs: Sequence[object] | None = None) -> list[PrecisionHazard]:
    """Every hazard of :class:`HazardKind` in an ATen graph with FakeTensor metadata; ``inputs`` (the
    graph's placeholders' values, e.g. the first call's) let each finding say how much is rounded."""
    findings = []
    note = _inductor_note()
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node.target not in _MULTIPLIES:
            continue
        dtype = _low_dtype(node)
        scaled = _factor(node)
        if dtype is None or scaled is None or abs(scaled[0]) < MIN_SCALE:
            continue
        sinks = _sinks(node)
        if not sinks:
            continue
        factor, operand = scaled
        measured = _measure(graph_module, node, operand, inputs, factor, _LOW[dtype])
        magnitude, example, step = measured if measured is not None else (None, None, None)
        findings.append(PrecisionHazard(node.name, HazardKind.LOW_PRECISION_SCALED_SINUSOID, magnitude,
                                        str(dtype).removeprefix("torch."), factor, _source(operand),
                                        tuple(f"{s.name} ({_SINKS[s.target]})" for s in sinks), example, step, note))
    return findings
