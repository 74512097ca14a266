"""Which dynamo graph input is which: module state (constant) or a forward argument, and its role.

Dynamo records where every graph input came from as a chain of *source* objects on the placeholder
(``node.meta["grapharg"].source``): a ``LocalSource`` for a frame local (a forward argument, or the
module itself), wrapped by attribute and item accesses (``AttrSource``, ``GetItemSource``,
``DictGetItemSource``) and by markers for module state (``*NNModuleSource``, ``*ParamBufferSource``).
kopt reads that chain, not the printed name (``L['self']._modules['attn']._parameters['weight']``,
whose format changes between torch releases). Anything reached through the module is module state
and becomes a constant; a forward argument gets the role given explicitly, else one inferred from its
name, and the report says which rule decided. An input whose chain is neither (a global, a synthetic
local, no source at all) is kept per-call, which is always correct but forgoes hoisting: its reason
starts with ``UNCLASSIFIED`` and the report lists it on a line of its own.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

import torch

from kopt.config import Role

log = logging.getLogger("kopt")

UNCLASSIFIED = "UNCLASSIFIED"
_MODULE_ROOTS = ("self", "fn")  # the frame local that holds the compiled module (forward's self, a wrapper's fn)
_STATE_DICTS = ("_modules", "_parameters", "_buffers")

# Names whose value is the same for every call of a denoising step (both CFG halves) and, for
# position ids, for every step: the binding-time analysis may hoist and memoize what they feed.
_STEP_INVARIANT = (
    (re.compile(r"(^|_)(timesteps?|t|sigmas?|noise_level)$"), "diffusion timestep"),
    (re.compile(r"guidance"), "guidance scale/embedding input"),
    (re.compile(r"(^|_)(img|txt|image|text|position|pos)_(ids|shapes)$|^position_ids$|^img_shapes$"),
     "position ids: identical across denoising steps"),
)


# A symbolic size (dynamic shapes) is the same on every call with that size, so what depends only on
# sizes and step-invariant inputs (RoPE tables from the sequence lengths) can be hoisted: the memo
# keys on the size's value, so a call with another size computes its own entry.
_SIZE_REASON = "a size (dynamic shapes): the memo keys on its value"


@dataclasses.dataclass(frozen=True)
class InputRole:
    """The binding time of one graph input and the rule that decided it (``module_path``: the
    parameter's dotted path in the module, for module state that has one)."""

    index: int
    source: str
    argument: str | None
    role: Role
    reason: str
    module_path: str | None = None


def _source(node: torch.fx.Node) -> Any:
    return getattr(node.meta.get("grapharg"), "source", None)


def source_name(node: torch.fx.Node) -> str:
    """Dynamo's source expression for a placeholder (for people), or its node name if dynamo left none."""
    source = _source(node)
    if source is None:
        return node.name
    name = source.name
    return name() if callable(name) else str(name)


def _chain(source: Any) -> list[Any]:
    """The source objects from the frame local (first) to the input itself (last)."""
    links = []
    while source is not None:
        links.append(source)
        source = getattr(source, "base", None)
    return links[::-1]


def _marks_module_state(link: Any) -> bool:
    kind = type(link).__name__
    return "NNModule" in kind or "ParamBuffer" in kind or getattr(link, "member", None) in ("_parameters", "_buffers")


def is_module_state(links: list[Any]) -> bool:
    """True for inputs read from the module itself (parameters, buffers, attributes)."""
    root = links[0] if links else None
    return (getattr(root, "local_name", None) in _MODULE_ROOTS and len(links) > 1) or any(
        _marks_module_state(link) for link in links)


def argument_name(links: list[Any], positional: tuple[str, ...] = ()) -> str | None:
    """The forward argument an input reads (``timestep`` for ``L['timestep']`` or
    ``L['kwargs']['timestep']``, or for a tensor inside it), None if it reads no forward argument.

    Positional arguments of a ``def wrapper(*args, **kwargs)`` (how kopt.compile and the engines
    call a forward) arrive as items of ``args``; ``positional`` (the forward signature's parameter
    names) turns them back into names. Any other local (a forward's own ``*rest``) names its items."""
    if not links or type(links[0]).__name__ != "LocalSource" or is_module_state(links):
        return None
    root = links[0]
    index = getattr(links[1], "index", None) if len(links) > 1 else None
    if root.local_name == "args" and isinstance(index, int):  # is_varargs is newer than torch 2.11
        return positional[index] if index < len(positional) else f"args[{index}]"
    if (getattr(root, "is_varkw", False) or root.local_name == "kwargs") and isinstance(index, str):
        return index
    return str(root.local_name)


def module_path(links: list[Any]) -> str | None:
    """``transformer_blocks.0.attn.to_q.weight`` for a parameter's source chain, whether dynamo
    reached it through ``_modules``/``_parameters`` dicts, ``__dict__`` or plain attributes and
    indexing; None for inputs not on the module, or a link this does not know."""
    if not links or not is_module_state(links):
        return None
    parts: list[str] = []
    for link in links[1:]:
        member, index = getattr(link, "member", None), getattr(link, "index", None)
        if member is not None:
            if member not in (*_STATE_DICTS, "__dict__"):
                parts.append(str(member))
        elif index is not None:
            if not (index in _STATE_DICTS and getattr(link.base, "member", None) == "__dict__"):
                parts.append(str(index))
        elif not _marks_module_state(link):
            return None  # a link with neither member nor index, and not a module marker
    return ".".join(parts) if parts else None


def infer_role(argument: str) -> tuple[Role, str]:
    """Role of a forward argument from its name alone."""
    for pattern, why in _STEP_INVARIANT:
        if pattern.search(argument):
            return Role.STEP_INVARIANT, f"inferred from the name '{argument}': {why}"
    return Role.PER_CALL, f"inferred from the name '{argument}': default for forward arguments"


def classify_inputs(placeholders: list[torch.fx.Node], example_inputs: list[object],
                    explicit: dict[str, Role], positional: tuple[str, ...] = ()) -> list[InputRole]:
    """One :class:`InputRole` per graph input, in order."""
    roles = []
    for index, (node, value) in enumerate(zip(placeholders, example_inputs, strict=True)):
        source, links = source_name(node), _chain(_source(node))
        argument = argument_name(links, positional)
        if isinstance(value, torch.nn.Parameter) or is_module_state(links):
            roles.append(InputRole(index, source, None, Role.CONSTANT, "module parameter or buffer",
                                   module_path(links)))
        elif isinstance(value, torch.SymInt):
            roles.append(InputRole(index, source, argument, Role.STEP_INVARIANT, _SIZE_REASON))
        elif argument is not None and argument in explicit:
            roles.append(InputRole(index, source, argument, explicit[argument], "given in roles="))
        elif argument is not None:
            role, why = infer_role(argument)
            roles.append(InputRole(index, source, argument, role, why))
        else:
            kind = type(links[-1]).__name__ if links else "no source"
            why = (f"{UNCLASSIFIED}: dynamo's source ({kind}) is neither module state nor a forward argument: "
                   "per-call (correct, but nothing it feeds is hoisted; roles= cannot name it)")
            log.warning("kopt: graph input %s: %s", source, why)
            roles.append(InputRole(index, source, None, Role.PER_CALL, why))
    return roles
