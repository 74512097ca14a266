"""Compile the code around the module that runs the blocks: ``regional=True, between_blocks="outer"``.

Regional compilation compiles the repeated blocks and runs everything else as written. In an LLM
from transformers the blocks are run by an inner module (``LlamaModel``, ``Gemma2Model``: the
*trunk*) and the model's own ``forward`` holds what comes after it: the LM head, and Gemma 2's final
logit soft cap, ``tanh(logits / 30) * 30``, three eager passes over 2048 x 256,000 logits (about
6 GB of memory traffic where one fused pass over the LM head's output moves 2 GB).

How: the model's ``forward`` is compiled by the same backend, with the trunk's call opaque to it:
the trunk's ``forward`` becomes a function dynamo does not trace (:func:`torch.compiler.disable`),
so tracing breaks the graph at the trunk's call and resumes after it. The trunk runs as written and
its blocks run their own compiled code (``torch.compile`` sets its own frame callback on entry, inside
a disabled region too). The code after the trunk becomes one graph: the LM head's GEMM and what
follows it, which Inductor fuses and FP8 reaches.

Why only the frames around the trunk: dynamo cannot resume a graph inside a loop. A break at a
block's call in the frame that loops over the blocks makes dynamo run that whole frame as written
(and compile the frames it calls instead), so the statements of the looping frame itself are out of
reach this way. A model whose own ``forward`` loops over its blocks (a diffusers DiT) has no code
around its trunk: :func:`compile_outer` refuses it, with that reason; ``between_blocks="compiled"``
(:mod:`kopt.opaque_blocks`) compiles that frame too, each block call one op in its graph.

Valid because a graph break runs the call it breaks at exactly as written. What it costs: one more
graph to compile and guard. Weights outside the blocks are never released (code that runs as written
reads them: :func:`kopt.regional.weights_read_outside`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from kopt.dynamo_cache import call_module, compile_fresh

_MISSING = object()
_SAVED = "_kopt_saved_forward"  # the forward a trunk had before (its class's, or an instance attribute)


def trunk(model: nn.Module, blocks: list[nn.Module]) -> nn.Module:
    """The innermost module of ``model`` whose submodules hold every one of ``blocks``: the one whose
    ``forward`` runs them."""
    if not blocks:
        raise ValueError("no blocks: nothing runs them")
    wanted = {id(b) for b in blocks}
    holder = model
    while True:
        inner = [c for c in holder.children() if wanted <= {id(m) for m in c.modules()}]
        if len(inner) != 1 or isinstance(inner[0], (nn.ModuleList, nn.ModuleDict, nn.Sequential)) \
                or id(inner[0]) in wanted:
            return holder
        holder = inner[0]


def has_code_around(model: nn.Module, blocks: list[nn.Module]) -> bool:
    """Whether an inner module of ``model`` runs ``blocks`` (a transformers LLM's ``LlamaModel``), so
    that ``model``'s own code around that module is a graph of its own (``between_blocks="outer"``);
    False when ``model``'s own ``forward`` runs them (a diffusers DiT)."""
    return trunk(model, blocks) is not model


def _opaque(module: nn.Module) -> None:
    """Give ``module`` a ``forward`` dynamo does not trace (the one it had, run as written)."""
    if is_opaque(module):
        return
    module.__dict__[_SAVED] = module.__dict__.get("forward", _MISSING)
    original = module.forward

    def kopt_trunk_forward(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    module.forward = torch.compiler.disable(kopt_trunk_forward, recursive=True)


def designed_break(reason: str) -> bool:
    """Whether a graph break dynamo counted is the one at the trunk's call :func:`compile_outer` makes."""
    return "kopt_trunk_forward" in reason


def compile_outer(model: nn.Module, blocks: list[nn.Module], backend: Callable[..., Any], *,
                  dynamic: bool | None) -> None:
    """Compile ``model``'s own code around the trunk that runs ``blocks`` with ``backend`` (module
    docstring); the blocks are compiled by the caller. Raises ValueError when ``model`` runs them itself."""
    if not has_code_around(model, blocks):
        raise ValueError(f"{type(model).__name__}'s own forward runs its blocks: there is no code around them "
                         "to compile (dynamo runs a frame that breaks inside a loop as written); use "
                         "between_blocks='compiled' (each block call one op in the model's graph), 'eager' or "
                         "'linears'")
    _opaque(trunk(model, blocks))
    compiled = compile_fresh(call_module, type(model).__name__, backend, fullgraph=False, dynamic=dynamic)
    model._compiled_call_impl = functools.partial(compiled, model)


def is_opaque(module: nn.Module) -> bool:
    """Whether :func:`compile_outer` made ``module`` (a trunk) opaque to dynamo."""
    return _SAVED in module.__dict__


def restore_forward(module: nn.Module) -> None:
    """Undo :func:`_opaque`: ``module`` gets back the forward it had."""
    if not is_opaque(module):
        return
    saved = module.__dict__.pop(_SAVED)
    if saved is _MISSING:
        module.__dict__.pop("forward", None)
    else:
        module.forward = saved


# instance attributes a regional compile may set: the module's compiled call, an instance ``forward``
# (a trunk's here, an opaque block's in kopt.opaque_blocks) and an opaque block's compiled code
_ENTRY_POINTS = ("_compiled_call_impl", "forward", "_kopt_compiled")


def compiled_state(modules: list[nn.Module]) -> dict[nn.Module, tuple[Any, ...]]:
    """Each module's compiled entry points, as its instance dictionary holds them (:data:`_ENTRY_POINTS`):
    what one regional compile set, to put back before calling it (two compiles can share one module).
    Exactly as held: dynamo guards on whether the dictionary has an entry, not only on its value."""
    return {m: tuple(m.__dict__.get(name, _MISSING) for name in _ENTRY_POINTS) for m in modules}


def set_state(state: dict[nn.Module, tuple[Any, ...]]) -> None:
    """Put back what :func:`compiled_state` saw."""
    for module, values in state.items():
        for name, value in zip(_ENTRY_POINTS, values, strict=True):
            if value is _MISSING:
                module.__dict__.pop(name, None)
            else:
                module.__dict__[name] = value


def run_as_written(modules: list[nn.Module]) -> None:
    """Clear ``modules``' compiled entry points: calls run each module as written, until
    :func:`set_state` puts them back."""
    from kopt.opaque_blocks import run_as_written as block_as_written

    for module in modules:
        module._compiled_call_impl = None
        block_as_written(module)
        if is_opaque(module):
            saved = module.__dict__[_SAVED]
            if saved is _MISSING:
                module.__dict__.pop("forward", None)
            else:
                module.forward = saved
