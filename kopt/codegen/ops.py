"""The elementwise vocabulary codegen understands: each op's meaning in Triton and in eager torch.

Every entry renders one line of float32 arithmetic from already-named operands (a value name such
as ``v3`` or a Python literal), once as Triton and once as torch. Both spellings compute the same
function on float32 values, which is what makes the eager ``reference()`` of a generated module a
faithful spec of its kernel: they differ only by the last-ulp behaviour of the two libraries
(``tanh`` and ``gelu`` are spelled through ``sigmoid`` in Triton, which has no ``tanh``; ``tanh``
near 0 through its series, where the sigmoid spelling cancels).

Why float32 everywhere: the kernel loads every input, widens it to float32, and rounds once per
output at the store; explicit casts to a narrower float (``x.to(bfloat16)`` in the model) are kept
as a round trip so the rounding the model asked for still happens.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch

Operand = str | float | bool | None  # a value name, or a literal scalar
Render = Callable[[Sequence[Operand]], str]

_TWO_SQRT_2_OVER_PI = 2.0 * math.sqrt(2.0 / math.pi)
# tanh through sigmoid, 2 sigmoid(2x) - 1, cancels its leading 1 near 0 (a relative error of eps / |x|:
# 6 % at 1e-6); below 1/8 the odd Taylor series to x^9 is used, whose next term is under 1e-11 x there.
_TANH = ("tl.where(tl.abs({a}) < 0.125, {a} * (1.0 + {a} * {a} * (-0.3333333333333333 + {a} * {a} * "
         "(0.13333333333333333 + {a} * {a} * (-0.05396825396825397 + {a} * {a} * 0.021869488536155203)))), "
         "2.0 * tl.sigmoid(2.0 * {a}) - 1.0)")
_SQRT_HALF = math.sqrt(0.5)


def lit(value: Operand) -> str:
    """A literal or value name as source text (floats always as floats, infinities spelled out)."""
    if isinstance(value, str):
        return value
    if value is None:
        return "None"
    if isinstance(value, bool):
        return repr(value)
    value = float(value)
    if math.isinf(value):
        return 'float("inf")' if value > 0 else '-float("inf")'
    if math.isnan(value):
        return 'float("nan")'
    return repr(value)


@dataclasses.dataclass(frozen=True)
class Elementwise:
    """One elementwise op: how many operands it takes and its two spellings."""

    arity: int
    triton: Render
    torch: Render
    returns_bool: bool = False


def _binary(symbol: str) -> Elementwise:
    return Elementwise(2, lambda a: f"{lit(a[0])} {symbol} {lit(a[1])}", lambda a: f"{lit(a[0])} {symbol} {lit(a[1])}")


def _compare(symbol: str) -> Elementwise:
    return Elementwise(2, lambda a: f"{lit(a[0])} {symbol} {lit(a[1])}",
                       lambda a: f"{lit(a[0])} {symbol} {lit(a[1])}", returns_bool=True)


def _unary(triton: str, torch_: str) -> Elementwise:
    return Elementwise(1, lambda a: triton.format(a=lit(a[0])), lambda a: torch_.format(a=lit(a[0])))


def _power(a: Sequence[Operand], function: str) -> str:
    """``x ** p``: repeated products for small integer exponents, exp/log otherwise (NaN for x < 0
    and a fractional p, as in torch)."""
    base, exponent = lit(a[0]), float(a[1])  # type: ignore[arg-type]
    if exponent == 0.5:
        return f"{function}.sqrt({base})"
    if exponent.is_integer() and 1 <= abs(exponent) <= 8:
        product = " * ".join([base] * int(abs(exponent)))
        return product if exponent > 0 else f"1.0 / ({product})"
    if exponent == 0:
        return f"{base} * 0.0 + 1.0"
    return f"{function}.exp({lit(exponent)} * {function}.log({base}))"


_NAN = "propagate_nan=tl.PropagateNan.ALL"  # torch's max/min/clamp/relu keep a NaN; Triton's default drops it


def _clamp_triton(a: Sequence[Operand]) -> str:
    text = lit(a[0])
    if a[1] is not None:
        text = f"tl.maximum({text}, {lit(a[1])}, {_NAN})"
    if a[2] is not None:
        text = f"tl.minimum({text}, {lit(a[2])}, {_NAN})"
    return text


ELEMENTWISE: dict[str, Elementwise] = {
    "add": _binary("+"),
    "sub": _binary("-"),
    "mul": _binary("*"),
    "div": _binary("/"),
    "gt": _compare(">"),
    "lt": _compare("<"),
    "ge": _compare(">="),
    "le": _compare("<="),
    "eq": _compare("=="),
    "ne": _compare("!="),
    "neg": _unary("-{a}", "-{a}"),
    "exp": _unary("tl.exp({a})", "torch.exp({a})"),
    "log": _unary("tl.log({a})", "torch.log({a})"),
    "sqrt": _unary("tl.sqrt({a})", "torch.sqrt({a})"),
    "rsqrt": _unary("tl.rsqrt({a})", "torch.rsqrt({a})"),
    "reciprocal": _unary("1.0 / {a}", "1.0 / {a}"),
    "abs": _unary("tl.abs({a})", "torch.abs({a})"),
    "erf": _unary("tl.erf({a})", "torch.erf({a})"),
    "sin": _unary("tl.sin({a})", "torch.sin({a})"),
    "cos": _unary("tl.cos({a})", "torch.cos({a})"),
    "sigmoid": _unary("tl.sigmoid({a})", "torch.sigmoid({a})"),
    "tanh": _unary(_TANH, "torch.tanh({a})"),
    "relu": _unary(f"tl.maximum({{a}}, 0.0, {_NAN})", "torch.relu({a})"),
    "silu": _unary("{a} * tl.sigmoid({a})", "torch.nn.functional.silu({a})"),
    "gelu_tanh": _unary(f"{{a}} * tl.sigmoid({_TWO_SQRT_2_OVER_PI!r} * ({{a}} + 0.044715 * {{a}} * {{a}} * {{a}}))",
                        'torch.nn.functional.gelu({a}, approximate="tanh")'),
    "gelu_erf": _unary(f"0.5 * {{a}} * (1.0 + tl.erf({{a}} * {_SQRT_HALF!r}))", "torch.nn.functional.gelu({a})"),
    "identity": _unary("{a}", "{a}"),
    "to_float": _unary("{a}.to(tl.float32)", "{a}.float()"),
    "round_bf16": _unary("{a}.to(tl.bfloat16).to(tl.float32)", "{a}.to(torch.bfloat16).float()"),
    "round_fp16": _unary("{a}.to(tl.float16).to(tl.float32)", "{a}.to(torch.float16).float()"),
    "pow": Elementwise(2, lambda a: _power(a, "tl"), lambda a: _power(a, "torch")),
    "maximum": Elementwise(2, lambda a: f"tl.maximum({lit(a[0])}, {lit(a[1])}, {_NAN})",
                           lambda a: f"torch.maximum({lit(a[0])}, {lit(a[1])})"),
    "minimum": Elementwise(2, lambda a: f"tl.minimum({lit(a[0])}, {lit(a[1])}, {_NAN})",
                           lambda a: f"torch.minimum({lit(a[0])}, {lit(a[1])})"),
    "where": Elementwise(3, lambda a: f"tl.where({lit(a[0])}, {lit(a[1])}, {lit(a[2])})",
                         lambda a: f"torch.where({lit(a[0])}, {lit(a[1])}, {lit(a[2])})"),
    "clamp": Elementwise(3, _clamp_triton, lambda a: f"{lit(a[0])}.clamp({lit(a[1])}, {lit(a[2])})"),
}

# Reductions over the last dim; each produces one or more per-row values (see triton_source).
REDUCTIONS = ("sum", "mean", "amax", "amin", "var", "var_mean", "layer_norm")

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TORCH_DTYPE_NAMES = {torch.float32: "torch.float32", torch.bfloat16: "torch.bfloat16",
                     torch.float16: "torch.float16", torch.bool: "torch.bool"}
