"""Inductor's implicit-fallback message for an op first seen after a deep chain of custom ops.

torch 2.11 and 2.12 build that message's text even with INFO off, and the text of an op after a chain
of extern kernels grows as 2**depth; ``kopt.lower`` then names each argument's buffer instead. torch
2.13 builds it only for a handler, so there kopt leaves torch alone unless INFO is on. These tests
measure the problem on the installed torch, so they fail when the patch stops being needed (or
becomes needed again) instead of keeping a workaround forever.
"""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch
import torch._inductor.config
from torch._inductor import exc, ir

import kopt.lower
from kopt.config import Lowering
from kopt.lower import (
    INDUCTOR_GRAPH_LOG,
    TORCH_FORMATS_FALLBACK_MESSAGES_EAGERLY,
    lower,
    operator_messages_are_built,
    shallow_operator_messages,
)

DEPTH = 12


@torch.library.custom_op("kopt_test::mix", mutates_args=())
def _mix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * 0.5 + b * 0.25


@_mix.register_fake
def _(a, b):
    return torch.empty_like(a)


def _new_op(name: str) -> object:
    """A new op type per lowering: Inductor creates (and logs) an op's implicit fallback once per process."""
    @torch.library.custom_op(f"kopt_test::{name}", mutates_args=())
    def op(a: torch.Tensor) -> torch.Tensor:
        return a + 1.0

    op.register_fake(lambda a: torch.empty_like(a))
    return getattr(torch.ops.kopt_test, name).default


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


@contextlib.contextmanager
def _inductor_graph_log(level: int):
    """Inductor's graph logger at ``level`` with a collecting handler. ``setLevel`` (not assigning
    ``level``) so that loggers' cached ``isEnabledFor`` answers from earlier compiles are dropped."""
    logger, collect = logging.getLogger(INDUCTOR_GRAPH_LOG), _Collect()
    previous = logger.level
    logger.setLevel(level)
    logger.addHandler(collect)
    try:
        yield collect.messages
    finally:
        logger.removeHandler(collect)
        logger.setLevel(previous)


def _lower_counting_printed_nodes(monkeypatch, name: str, level: int) -> tuple[object, object, list[str], int]:
    """Lower a chain ending in a new op with Inductor's graph log at ``level``: the compiled callable, the
    chain, the implicit-fallback messages, and how many IR nodes' text was built."""
    printed = []  # every IR node's text goes through str_helper
    original = ir.IRNode.str_helper
    monkeypatch.setattr(ir.IRNode, "str_helper", lambda self, *a, **k: printed.append(1) or original(self, *a, **k))
    chain = _chain(DEPTH, _new_op(name))
    # without the FX graph cache: a cached graph is not lowered again, and logs nothing
    with _inductor_graph_log(level) as messages, torch._inductor.config.patch(fx_graph_cache=False):
        compiled = lower(chain, [torch.randn(4, 8)], Lowering.INDUCTOR)
    return compiled, chain, [m for m in messages if "implicit fallback" in m], len(printed)


def _without_the_patch(monkeypatch) -> None:
    monkeypatch.setattr(kopt.lower, "shallow_operator_messages", contextlib.nullcontext)


def test_without_the_patch_and_with_info_off_torch_builds_the_text_exactly_where_kopt_patches(monkeypatch):
    """The problem as users meet it (INFO off): on torch < 2.13 lowering builds at least 2**depth IR
    texts, on 2.13+ almost none. If a torch release changes that, this fails and the gate in
    kopt.lower (TORCH_FORMATS_FALLBACK_MESSAGES_EAGERLY) must follow."""
    _without_the_patch(monkeypatch)
    _, _, messages, printed = _lower_counting_printed_nodes(monkeypatch, "unpatched_info_off", logging.WARNING)
    assert not messages
    if TORCH_FORMATS_FALLBACK_MESSAGES_EAGERLY:
        assert printed >= 2**DEPTH
    else:
        assert printed < 100


def test_without_the_patch_and_with_info_on_the_message_prints_the_chain_exponentially(monkeypatch):
    """With Inductor's INFO log on (``TORCH_LOGS=inductor``), every torch builds the text: 2**depth IR texts."""
    _without_the_patch(monkeypatch)
    _, _, messages, printed = _lower_counting_printed_nodes(monkeypatch, "unpatched_info_on", logging.INFO)
    assert any("kopt_test.unpatched_info_on" in m for m in messages)
    assert printed >= 2**DEPTH


@pytest.mark.parametrize("level", [logging.INFO, logging.WARNING], ids=["info-on", "info-off"])
def test_a_deep_chain_lowers_printing_no_history(monkeypatch, level):
    """Through kopt's lowering, the op after the chain costs a few IR texts, not 2**depth, and the lowered
    chain computes what the graph does; with INFO on, the message names its argument's buffer and size."""
    name = f"patched_{logging.getLevelName(level).lower()}"
    compiled, chain, messages, printed = _lower_counting_printed_nodes(monkeypatch, name, level)
    assert printed < 100
    if level == logging.INFO:
        (message,) = [m for m in messages if f"kopt_test.{name}" in m]
        assert "args[0]: TensorBox(buf" in message and "size=[4, 8]" in message
    x = torch.randn(4, 8)
    out, expected = compiled(x), chain(x)  # compile_fx may have made the graph return a list
    first = [v[0] if isinstance(v, (list, tuple)) else v for v in (out, expected)]
    assert torch.allclose(*first)


_TORCH_OPERATOR_STR = exc.OperatorIssue.__dict__.get("operator_str")


def _patched() -> bool:
    return exc.OperatorIssue.__dict__.get("operator_str") is not _TORCH_OPERATOR_STR


def test_the_patch_is_applied_only_where_torch_builds_the_text():
    """INFO off: patched on torch < 2.13 only; INFO on: patched on every torch."""
    with _inductor_graph_log(logging.WARNING):
        assert operator_messages_are_built() is TORCH_FORMATS_FALLBACK_MESSAGES_EAGERLY
        with shallow_operator_messages():
            assert _patched() is TORCH_FORMATS_FALLBACK_MESSAGES_EAGERLY
    with _inductor_graph_log(logging.INFO), shallow_operator_messages():
        assert _patched()
    assert not _patched()


def test_torch_operator_str_is_restored_and_the_patch_nests():
    with _inductor_graph_log(logging.INFO):
        original = exc.OperatorIssue.__dict__["operator_str"]
        with shallow_operator_messages():
            with shallow_operator_messages():
                patched = exc.OperatorIssue.__dict__["operator_str"]
            assert exc.OperatorIssue.__dict__["operator_str"] is patched  # the outer compile still holds it
        assert exc.OperatorIssue.__dict__["operator_str"] is original
        assert patched is not original
