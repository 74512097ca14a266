"""Inductor's implicit-fallback message for an op first seen after a deep chain of custom ops."""

from __future__ import annotations

import logging

import torch
from torch._inductor import exc, ir

from kopt.config import Lowering
from kopt.lower import lower, shallow_operator_messages


@torch.library.custom_op("kopt_test::mix", mutates_args=())
def _mix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * 0.5 + b * 0.25


@_mix.register_fake
def _(a, b):
    return torch.empty_like(a)


@torch.library.custom_op("kopt_test::last", mutates_args=())
def _last(a: torch.Tensor) -> torch.Tensor:
    return a + 1.0


@_last.register_fake
def _(a):
    return torch.empty_like(a)


def _chain(depth: int) -> torch.fx.GraphModule:
    """x -> mix(x, x) -> ... (``depth`` times) -> last: each mix reads its input twice, so printing the
    last op's argument with its history prints 2**depth copies of the first."""
    graph = torch.fx.Graph()
    value = graph.placeholder("x")
    for _ in range(depth):
        value = graph.call_function(torch.ops.kopt_test.mix.default, (value, value))
    graph.output(graph.call_function(torch.ops.kopt_test.last.default, (value,)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_deep_chain_lowers_with_messages_formatted_and_printing_no_history(monkeypatch):
    """With INFO on (torch 2.11 formats the message either way), lowering formats each implicit fallback's
    message, and the one for the op after the chain names its argument without printing the chain: IR
    nodes' text is built a few times, not 2**depth times."""
    printed = []  # every IR node's text goes through str_helper (without the patch: 2**13 - 2 calls at depth 12)
    original = ir.IRNode.str_helper
    monkeypatch.setattr(ir.IRNode, "str_helper", lambda self, *a, **k: printed.append(1) or original(self, *a, **k))
    x = torch.randn(4, 8)
    logger, collect = logging.getLogger("torch._inductor.graph"), _Collect()
    monkeypatch.setattr(logger, "level", logging.INFO)
    logger.addHandler(collect)
    try:
        compiled = lower(_chain(24), [x], Lowering.INDUCTOR)
    finally:
        logger.removeHandler(collect)
    (message,) = [m for m in collect.messages if "implicit fallback" in m and "kopt_test.last" in m]
    assert "args[0]: TensorBox(buf" in message and "size=[4, 8]" in message
    assert len(printed) < 100
    out = compiled(x)
    assert torch.allclose(out[0] if isinstance(out, (list, tuple)) else out, _chain(24)(x))


def test_torch_operator_str_is_restored_and_the_patch_nests():
    original = exc.OperatorIssue.__dict__["operator_str"]
    with shallow_operator_messages():
        with shallow_operator_messages():
            patched = exc.OperatorIssue.__dict__["operator_str"]
        assert exc.OperatorIssue.__dict__["operator_str"] is patched  # the outer compile still holds it
    assert exc.OperatorIssue.__dict__["operator_str"] is original
    assert patched is not original
