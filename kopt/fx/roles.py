"""Which dynamo graph input is which: module state (constant) or a forward argument, and its role.

Dynamo names every graph input by the Python expression it came from (its *source*), e.g.
``L['self']._modules['attn']._parameters['weight']`` or ``L['kwargs']['timestep']``. Anything read
from the module (``L['self']``) is module state and becomes a constant; a forward argument gets the
role given explicitly, else one inferred from its name, and the report says which rule decided.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from kopt.config import Role

_ARGUMENT = re.compile(r"^L\[(?:'kwargs'\]\[)?'(?P<name>[^']+)'\]")
_POSITIONAL = re.compile(r"^L\['args'\]\[(?P<index>\d+)\]")
_MODULE_STATE = re.compile(r"^L\['(self|fn)'\]|\._(parameters|buffers)\[")

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
    """The binding time of one graph input and the rule that decided it."""

    index: int
    source: str
    argument: str | None
    role: Role
    reason: str


def source_name(node: torch.fx.Node) -> str:
    """Dynamo's source expression for a placeholder, or its node name if dynamo left none."""
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    if source is None:
        return node.name
    name = source.name
    return name() if callable(name) else str(name)


def is_module_state(source: str) -> bool:
    """True for sources read from the module itself (parameters, buffers, attributes)."""
    return _MODULE_STATE.search(source) is not None


def argument_name(source: str, positional: tuple[str, ...] = ()) -> str | None:
    """The forward argument a source reads (``L['timestep']`` -> ``timestep``), None for module state.

    Positional arguments arrive as ``L['args'][i]``; ``positional`` (the forward signature's
    parameter names) turns them back into names.
    """
    if is_module_state(source):
        return None
    match = _POSITIONAL.match(source)
    if match:
        index = int(match.group("index"))
        return positional[index] if index < len(positional) else f"args[{index}]"
    match = _ARGUMENT.match(source)
    return match.group("name") if match else None


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
        source = source_name(node)
        argument = argument_name(source, positional)
        if isinstance(value, torch.nn.Parameter) or is_module_state(source):
            roles.append(InputRole(index, source, None, Role.CONSTANT, "module parameter or buffer"))
        elif isinstance(value, torch.SymInt):
            roles.append(InputRole(index, source, argument, Role.STEP_INVARIANT, _SIZE_REASON))
        elif argument is not None and argument in explicit:
            roles.append(InputRole(index, source, argument, explicit[argument], "given in roles="))
        elif argument is not None:
            role, why = infer_role(argument)
            roles.append(InputRole(index, source, argument, role, why))
        else:
            roles.append(InputRole(index, source, None, Role.PER_CALL, "unrecognised source: per-call"))
    return roles


_SOURCE_PART = re.compile(r"\.__dict__\['_(?:modules|parameters|buffers)'\]\['([^']+)'\]|"
                          r"\._(?:modules|parameters|buffers)\['([^']+)'\]|\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")


def module_path(source: str) -> str | None:
    """``transformer_blocks.0.attn.to_q.weight`` for dynamo's source of a parameter, e.g.
    ``L['self'].__dict__['_modules']['transformer_blocks']._modules['0']...._parameters['weight']``
    or ``L['self'].transformer_blocks[0].attn.to_q.weight``; None for sources not on the module."""
    match = re.match(r"^L\['(?:self|fn)'\]", source)
    if match is None:
        return None
    rest, parts = source[match.end():], []
    while rest:
        part = _SOURCE_PART.match(rest)
        if part is None:
            return None
        parts.append(next(g for g in part.groups() if g is not None))
        rest = rest[part.end():]
    return ".".join(parts)

