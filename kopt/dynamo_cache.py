"""Give every ``kopt.compile`` dynamo cache state of its own.

Dynamo keeps compiled graphs per *code object*: every instance of a class, and every
``torch.compile`` of it, shares the cache of ``type(module).forward.__code__``, and with it the
recompile limit (8 entries). Each ``kopt.compile`` brings a new backend, which never matches the
entries of an earlier one, so the 9th compilation of the same module in a process (a notebook cell
run nine times) found the limit used up and ran eagerly, silently.

A new compilation must start clean without touching anyone else's compiled state, so kopt does not
reset the code's cache (``torch._dynamo.reset_code`` would also drop the graphs of every other
compiled instance of the class). Instead:

* torch >= 2.13: ``torch.compile(..., isolate_recompiles=True)``, dynamo's own per-call cache region:
  this compilation's entries, recompile count and eager-only state are its own, for every frame it
  compiles (graph-break continuations and sub-module frames included);
* older torch: the module is called through a wrapper function with a code object of its own, so the
  outermost frame's cache and limit belong to this compilation alone. Frames dynamo compiles below a
  graph break still share their code's cache there; if they hit the limit, :mod:`kopt.fallback` says so.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import types
from collections.abc import Callable
from typing import Any

import torch

from kopt.unit_strides import with_canonical_unit_strides

ISOLATES_RECOMPILES = "isolate_recompiles" in inspect.signature(torch.compile).parameters
_serial = itertools.count()


def _call_module(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    return self(*args, **kwargs)


def _fresh_caller(module: torch.nn.Module) -> Callable[..., Any]:
    """``_call_module`` with a new code object (named after the module, for dynamo's logs)."""
    name = f"kopt_{type(module).__name__}_{next(_serial)}"
    code = _call_module.__code__.replace(co_name=name)
    return types.FunctionType(code, _call_module.__globals__, name)


class _CallerModule:
    """Calls ``compiled(module, *args, **kwargs)``: the fresh-code path's stand-in for an OptimizedModule."""

    def __init__(self, module: torch.nn.Module, compiled: Callable[..., Any]) -> None:
        self._module, self._compiled = module, compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._compiled(self._module, *args, **kwargs)


def compile_isolated(module: torch.nn.Module, backend: Callable[..., Any], *, fullgraph: bool,
                     dynamic: bool | None, isolate: bool | None = None) -> Callable[..., Any]:
    """``torch.compile(module, backend=backend, ...)`` with cache state of its own (module docstring).

    ``isolate``: use dynamo's ``isolate_recompiles`` (default: when this torch has it) or, False, the
    fresh-code wrapper (the path for torch 2.11 and 2.12, testable on any version)."""
    isolate = ISOLATES_RECOMPILES if isolate is None else isolate
    if isolate:
        return torch.compile(module, backend=backend, fullgraph=fullgraph, dynamic=dynamic,
                             isolate_recompiles=True)
    compiled = torch.compile(_fresh_caller(module), backend=backend, fullgraph=fullgraph, dynamic=dynamic)
    return _CallerModule(module, compiled)


def call_module(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``self(*args, **kwargs)`` through ``_call_impl`` (hooks and ``forward``), past any compiled call."""
    return self._call_impl(*args, **kwargs)


def compile_fresh(function: Callable[..., Any], name: str, backend: Callable[..., Any], *, fullgraph: bool,
                  dynamic: bool | None) -> Callable[..., Any]:
    """``torch.compile(function)`` under a new code object named ``kopt_<name>_<n>``: its dynamo cache
    belongs to this compile alone (with ``isolate_recompiles``, where torch has it, the frames below its
    graph breaks too), so no other compilation's entries or recompile count reach it."""
    code = function.__code__.replace(co_name=f"kopt_{name}_{next(_serial)}")
    fresh = types.FunctionType(code, function.__globals__, code.co_name)
    options = {"isolate_recompiles": True} if ISOLATES_RECOMPILES else {}
    return torch.compile(fresh, backend=backend, fullgraph=fullgraph, dynamic=dynamic, **options)


def compile_blocks_isolated(blocks: list[torch.nn.Module], backend: Callable[..., Any], *, fullgraph: bool,
                            dynamic: bool | None,
                            within: Callable[[], contextlib.AbstractContextManager[Any]] | None = None) -> None:
    """Compile ``blocks`` as ``nn.Module.compile`` would, with dynamo cache state of their own.

    ``nn.Module.compile`` compiles ``_call_impl``, whose frame dynamo skips, so the cache is that of
    each block class's ``forward``: shared by every compilation of the class in the process, and the
    9th regional compile of a model found the recompile limit used up and ran eagerly. Here one
    ``torch.compile`` of a function with a new code object serves every block (each block calls it
    with itself as the first argument): its cache belongs to this compilation, and one block's graph
    still serves the others of its class, since under ``inline_inbuilt_nn_modules`` a block is an
    input of the frame, guarded by type and parameter shapes, not by identity, and its tensor
    arguments' size-1 strides are made canonical (:mod:`kopt.unit_strides`).

    ``within``: a context every call of these blocks runs in, so that what they compile can tell them
    from other blocks (an FP8 selection of their own: :mod:`kopt.fp8.per_block`)."""
    compiled = with_canonical_unit_strides(compile_fresh(call_module, "blocks", backend, fullgraph=fullgraph,
                                                         dynamic=dynamic))
    for block in blocks:
        block._compiled_call_impl = (functools.partial(compiled, block) if within is None
                                     else functools.partial(call_within, within, compiled, block))


def call_within(within: Callable[[], contextlib.AbstractContextManager[Any]], function: Callable[..., Any],
                *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` inside the context ``within()`` makes (a block group's FP8
    selection while its compiled code runs and compiles)."""
    with within():
        return function(*args, **kwargs)
