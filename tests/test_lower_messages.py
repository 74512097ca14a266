"""Inductor's implicit-fallback message for an op first seen after a deep chain of custom ops."""

from __future__ import annotations

import contextlib
import logging

import torch
import torch._inductor.config
from torch._inductor import exc, ir

import kopt.lower
from kopt.config import Lowering
from kopt.lower import lower, shallow_operator_messages

DEPTH = 12


@torch.library.custom_op("kopt_test::mix", mutates_args=())
def _mix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * 0.5 + b * 0.25


@_mix.register_fake
def _(a, b):
    return torch.empty_like(a)


def _add_one_op(name: str) -> object:
    """A new op type per test: Inductor logs an op's implicit fallback once per process, at its first lowering."""
    @torch.library.custom_op(f"kopt_test::{name}", mutates_args=())
    def op(a: torch.Tensor) -> torch.Tensor:
        return a + 1.0

    op.register_fake(lambda a: torch.empty_like(a))
    return getattr(torch.ops.kopt_test, name).default


LAST_PATCHED, LAST_UNPATCHED = _add_one_op("last_patched"), _add_one_op("last_unpatched")


def _chain(depth: int, last: object) -> torch.fx.GraphModule:
    """x -> mix(x, x) -> ... (``depth`` times) -> last: each mix reads its input twice, so printing the
    last op's argument with its history prints 2**depth copies of the first."""
    graph = torch.fx.Graph()
    value = graph.placeholder("x")
    for _ in range(depth):
        value = graph.call_function(torch.ops.kopt_test.mix.default, (value, value))
    graph.output(graph.call_function(last, (value,)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _lower_counting_printed_nodes(monkeypatch, last: object) -> tuple[object, list[str], int]:
    """Lower the chain with Inductor's INFO log on (torch 2.11 formats its messages either way): the
    compiled callable, the implicit-fallback messages, and how many IR nodes' text was built."""
    printed = []  # every IR node's text goes through str_helper
    original = ir.IRNode.str_helper
    monkeypatch.setattr(ir.IRNode, "str_helper", lambda self, *a, **k: printed.append(1) or original(self, *a, **k))
    logger, collect = logging.getLogger("torch._inductor.graph"), _Collect()
    monkeypatch.setattr(logger, "level", logging.INFO)
    logger.addHandler(collect)
    try:  # without the FX graph cache: a cached graph is not lowered again, and logs nothing
        with torch._inductor.config.patch(fx_graph_cache=False):
            compiled = lower(_chain(DEPTH, last), [torch.randn(4, 8)], Lowering.INDUCTOR)
    finally:
        logger.removeHandler(collect)
    return compiled, [m for m in collect.messages if "implicit fallback" in m], len(printed)


def test_a_deep_chain_lowers_with_messages_formatted_and_printing_no_history(monkeypatch):
    """The message for the op after the chain names its argument without printing the chain: IR nodes'
    text is built a few times, not 2**depth times, and the lowered chain computes what the graph does."""
    compiled, messages, printed = _lower_counting_printed_nodes(monkeypatch, LAST_PATCHED)
    (message,) = [m for m in messages if "kopt_test.last_patched" in m]
    assert "args[0]: TensorBox(buf" in message and "size=[4, 8]" in message
    assert printed < 100
    x = torch.randn(4, 8)
    out = compiled(x)
    assert torch.allclose(out[0] if isinstance(out, (list, tuple)) else out, _chain(DEPTH, LAST_PATCHED)(x))


def test_without_the_patch_the_message_prints_the_chain_exponentially(monkeypatch):
    """What the patch prevents, measured here: Inductor's own message builds at least 2**depth IR texts."""
    monkeypatch.setattr(kopt.lower, "shallow_operator_messages", contextlib.nullcontext)
    _, messages, printed = _lower_counting_printed_nodes(monkeypatch, LAST_UNPATCHED)
    assert any("kopt_test.last_unpatched" in m for m in messages)
    assert printed >= 2**DEPTH


def test_torch_operator_str_is_restored_and_the_patch_nests():
    original = exc.OperatorIssue.__dict__["operator_str"]
    with shallow_operator_messages():
        with shallow_operator_messages():
            patched = exc.OperatorIssue.__dict__["operator_str"]
        assert exc.OperatorIssue.__dict__["operator_str"] is patched  # the outer compile still holds it
    assert exc.OperatorIssue.__dict__["operator_str"] is original
    assert patched is not original
