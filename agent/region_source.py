"""A canonical region graph as Python source: ``def region(in0, ...)`` calling ATen ops.

The source is how a region travels: the knowledge base stores it, the verifier times the original
region through the same harness as a candidate, and a proposer (or an LLM) reads it. Devices are
taken from the first input, so one source runs on the CPU and on a GPU.

A stored source can come from an imported file, so before kopt traces one (in its own process, not
in the sandbox) :func:`check_region_source` accepts only what :func:`render_source` writes: one
``region`` function of assignments from ATen op calls, getitems and small constant tensors, and a
return. Anything else (another call, an attribute walk, a loop) is refused.
"""

from __future__ import annotations

import ast
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
    return f"    {name} = torch.tensor({_literal(value.tolist(), device)}, dtype={value.dtype}, device={device})"


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


_ALLOWED_CALLS = ("aten.", "torch.ops.", "torch.tensor", "float", "torch.device")
_ALLOWED_NAMES = ("torch.", "aten.")


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _check_value(node: ast.AST, names: set[str]) -> str | None:
    """None if ``node`` is a literal, a known name, ``inN.device``, a getitem, or an allowed call."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool, type(None))):
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _check_value(node.operand, names)
    if isinstance(node, (ast.List, ast.Tuple)):
        return next((r for r in (_check_value(e, names) for e in node.elts) if r), None)
    if isinstance(node, ast.Name):
        return None if node.id in names else f"unknown name {node.id!r}"
    if isinstance(node, ast.Subscript):
        if isinstance(node.value, ast.Name) and node.value.id in names and isinstance(node.slice, ast.Constant):
            return None
        return "a subscript other than value[index]"
    dotted = _dotted(node)
    if dotted is not None:
        root = dotted.split(".")[0]
        if dotted.startswith(_ALLOWED_NAMES) or (root in names and dotted == f"{root}.device"):
            return None
        return f"attribute {dotted!r}"
    if isinstance(node, ast.Call):
        func = _dotted(node.func) or ""
        if not func.startswith(_ALLOWED_CALLS) or func.count(".") > 4 or "__" in func:
            return f"call of {func or 'an expression'}"
        parts = list(node.args) + [k.value for k in node.keywords]
        return next((r for r in (_check_value(p, names) for p in parts) if r), None)
    return f"{type(node).__name__} expression"


def check_region_source(source: str) -> str | None:
    """None if ``source`` has the shape :func:`render_source` writes; otherwise why not."""
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        return f"does not parse: {error.msg}"
    body = list(tree.body)
    if not body or not isinstance(body[0], ast.Import) or [a.name for a in body[0].names] != ["torch"]:
        return "must start with 'import torch'"
    if len(body) != 3 or ast.unparse(body[1]) != "aten = torch.ops.aten":
        return "must be 'import torch', 'aten = torch.ops.aten' and one function"
    function = body[2]
    if not isinstance(function, ast.FunctionDef) or function.name != "region" or function.decorator_list:
        return "the function must be a plain 'def region(...)'"
    names = {a.arg for a in function.args.args}
    for statement in function.body[:-1]:
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)):
            return f"line {statement.lineno}: only 'name = value' statements are allowed"
        problem = _check_value(statement.value, names)
        if problem:
            return f"line {statement.lineno}: {problem}"
        names.add(statement.targets[0].id)
    last = function.body[-1]
    if not isinstance(last, ast.Return) or last.value is None:
        return "the function must end with a return"
    return _check_value(last.value, names)
