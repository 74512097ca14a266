"""Lowering: hand a (rewritten) graph to Inductor, or run it as plain FX."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from kopt.config import Lowering

# graph_module.meta: Inductor config patches for this graph alone, over the compile's own (a pipeline
# choice of the agent's knowledge base: :mod:`kopt.agent.auto_pipeline`)
INDUCTOR_PATCHES_KEY = "kopt_inductor_patches"


def lower(graph_module: torch.fx.GraphModule, example_inputs: list[object],
          lowering: Lowering, inductor_options: Mapping[str, object] | None = None) -> Callable[..., object]:
    """A callable that runs ``graph_module`` on arguments shaped like ``example_inputs``
    (``inductor_options``: Inductor config patches, e.g. ``max_autotune``)."""
    if lowering is Lowering.EAGER:
        return graph_module
    from torch._inductor.compile_fx import compile_fx

    with shallow_operator_messages():
        return compile_fx(graph_module, example_inputs, config_patches=dict(inductor_options or {}) or None)


def _torch_release() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


# torch 2.11 and 2.12 build the implicit-fallback message (below) whether or not INFO is on; 2.13 wraps
# it in a LazyString (pytorch/pytorch#185951), so it is built only when a handler takes the record.
TORCH_FORMATS_FALLBACK_MESSAGES_EAGERLY = _torch_release() < (2, 13)
INDUCTOR_GRAPH_LOG = "torch._inductor.graph"


def operator_messages_are_built() -> bool:
    """Whether lowering will build the text of Inductor's implicit-fallback messages: always on
    torch < 2.13, and on any torch while its graph logger takes INFO (``TORCH_LOGS=inductor``)."""
    return TORCH_FORMATS_FALLBACK_MESSAGES_EAGERLY or logging.getLogger(INDUCTOR_GRAPH_LOG).isEnabledFor(logging.INFO)


_patch_lock = threading.Lock()
_patch_depth = 0  # compiles inside the patch (threads, nesting): the last one out restores torch's own
_torch_operator_str: Any = None


@contextlib.contextmanager
def shallow_operator_messages() -> Iterator[None]:
    """Inductor's messages about an operator name each argument's buffer instead of printing its history.

    Why: Inductor lowers an op without a lowering of its own (every ``kopt::`` op) through an "implicit
    fallback", logged once per op type with ``OperatorIssue.operator_str``, which prints each argument
    IR node; an extern kernel's text contains its inputs' text, recursively. torch 2.11 and 2.12 format
    that message whether or not INFO is on (2.13 and later, only for a handler). kopt's fusions chain extern
    kernels through every block, and a graph reaches each shared value by several paths, so the text of
    an op type first seen after the last block grows exponentially with depth. Qwen-Image's last block
    boundary is the only non-quantizing ``gated_residual`` (its output projection stays bf16; the
    tiny model with the same FP8 choices lowers it as the last new op type), after 60 blocks of fused
    kernels: lowering can spend minutes building this text. Naming each buffer keeps the message's
    content for a reader (op, arguments' names and sizes) at a constant cost.

    Applied only where the text is built (:func:`operator_messages_are_built`): on torch >= 2.13 with
    Inductor's INFO log off, torch's own ``operator_str`` is left alone because nothing calls it.
    """
    global _patch_depth, _torch_operator_str
    from torch._inductor import exc

    issue = getattr(exc, "OperatorIssue", None)
    if issue is None or not hasattr(issue, "operator_str") or not operator_messages_are_built():
        yield
        return
    with _patch_lock:
        if _patch_depth == 0:
            _torch_operator_str = issue.__dict__.get("operator_str")  # None: inherited from a base class
            issue.operator_str = staticmethod(_operator_str)
        _patch_depth += 1
    try:
        yield
    finally:
        with _patch_lock:
            _patch_depth -= 1
            if _patch_depth == 0 and _torch_operator_str is None:
                del issue.operator_str
            elif _patch_depth == 0:
                issue.operator_str = _torch_operator_str


def _operator_str(target: Any, args: list[Any], kwargs: dict[str, Any]) -> str:
    lines = [f"target: {target}"] + [f"args[{i}]: {_describe(arg)}" for i, arg in enumerate(args)]
    if kwargs:
        lines.append(f"kwargs: {_describe(kwargs)}")
    return "\n".join("  " + line for line in lines)


def _describe(value: Any) -> str:
    """One line per argument: an IR node by its class, buffer name and size, never its inputs."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_describe(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in value.items()) + "}"
    if type(value).__module__.startswith("torch._inductor"):
        parts = [_try(lambda: str(value.get_name())), _try(lambda: f"size={list(value.get_size())}")]
        return f"{type(value).__name__}({', '.join(p for p in parts if p)})"
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _try(describe: Callable[[], str]) -> str:
    try:
        return describe()
    except Exception:  # noqa: BLE001 - an unrealized or sizeless node: say what is known
        return ""
