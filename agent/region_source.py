"""A canonical region graph as Python source: ``def region(in0, ...)`` calling ATen ops.

The source is how a region travels: the knowledge base stores it, the verifier times the original
region through the same harness as a candidate, and a proposer (or an LLM) reads it. Devices are
taken from the first input, so one source runs on the CPU and on a GPU.
"""

from __future__ import annotations

import math
import operator

import torch

_HEADER = "import torch\n\naten = torch.ops.aten\n\n\n"


def _literal(value: object, device: str) -> str:
    if isinstance(value, torch.fx.Node):
        return value.name
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_literal(v, device) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        return repr(value)
    if isinstance(value, torch.device):
        return device
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    raise TypeError(f"cannot render {type(value).__name__} {value!r} as source")


def _target(target: object) -> str:
    if isinstance(target, torch._ops.OpOverload):
        namespace = target.namespace
        prefix = "aten" if namespace == "aten" else f"torch.ops.{namespace}"
        return f"{prefix}.{target._opname}.{target._overloadname}"
    raise TypeError(f"cannot render call target {target!r}")


def _constant(name: str, value: torch.Tensor, device: str) -> str:
    return f"    {name} = torch.tensor({value.tolist()!r}, dtype={value.dtype}, device={device})"


def render_source(graph: torch.fx.Graph) -> str:
    """The function ``region`` for a canonical graph (placeholders, constants, calls, output)."""
    placeholders = [n.name for n in graph.nodes if n.op == "placeholder"]
    device = f"{placeholders[0]}.device" if placeholders else "None"
    lines = [f"def region({', '.join(placeholders)}):"]
    for node in graph.nodes:
        if node.op == "get_attr":
            lines.append(_constant(node.name, node.meta["kopt_constant"], device))
        elif node.op == "call_function" and node.target is operator.getitem:
            lines.append(f"    {node.name} = {node.args[0].name}[{node.args[1]}]")
        elif node.op == "call_function":
            args = [_literal(a, device) for a in node.args]
            args += [f"{k}={_literal(v, device)}" for k, v in node.kwargs.items()]
            lines.append(f"    {node.name} = {_target(node.target)}({', '.join(args)})")
        elif node.op == "output":
            lines.append(f"    return {_literal(tuple(node.args[0]), device)}")
    return _HEADER + "\n".join(lines) + "\n"
