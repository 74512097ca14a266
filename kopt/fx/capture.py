"""Capture: turn dynamo's torch-level graph into a functional ATen graph with frozen constants.

Why ATen and not dynamo's torch IR: the torch IR spells one computation many ways (``F.linear``,
``x @ w.T``, ``x.view`` / ``torch.reshape``, in-place ``add_``); after ``make_fx`` +
``functionalize`` each has one canonical, side-effect-free spelling (``mm``/``addmm`` on a
constant, ``view``), so a pass matches what the graph *computes*. Parameters and buffers are
closed over while tracing and so become ``get_attr`` constants that passes may concatenate,
quantize or fold. Tracing runs under FakeTensor, so every node carries ``meta["val"]``
(shape, dtype, device) and nothing real is computed.

Dynamic shapes: when dynamo hands over a graph with symbolic sizes, capture traces with dynamo's
own fakes and FakeTensorMode (:mod:`kopt.fx.symbolic`), so every ``meta["val"]`` carries the
symbols, size inputs stay SymInt placeholders, and any guard a later decision needs is installed
by dynamo with the frame's own.
"""

from __future__ import annotations

import dataclasses

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from kopt.config import Role
from kopt.fx.constants import constant_value
from kopt.fx.roles import InputRole
from kopt.fx.symbolic import (
    allowing_real_constants,
    concrete,
    dynamo_fakes,
    fake_mode_of,
    restart_specializing,
    tensorified_scalar,
)


class CaptureUnsupported(Exception):
    """The dynamo graph has a feature capture does not handle; the original graph is lowered."""


@dataclasses.dataclass
class CapturedGraph:
    """A frozen ATen graph plus how to call it from dynamo's argument list.

    Attributes:
        graph_module: functional ATen graph; inputs are the non-constant dynamo inputs, in order.
        roles: one entry per dynamo input.
        user_indices: positions (in dynamo's argument list) of the graph module's inputs.
        constants: (dynamo position, tensor) of every frozen input, to detect weight changes.
    """

    graph_module: torch.fx.GraphModule
    roles: list[InputRole]
    user_indices: list[int]
    constants: list[tuple[int, torch.Tensor]]

    def user_args(self, args: tuple[object, ...] | list[object]) -> list[object]:
        return [args[i] for i in self.user_indices]


def _check_supported(example_inputs: list[object], symbolic: bool) -> None:
    for position, value in enumerate(example_inputs):
        if symbolic and isinstance(value, (torch.SymInt, int)):
            continue  # a size: traced as a SymInt placeholder
        if isinstance(value, (torch.SymFloat, torch.SymBool)):
            raise CaptureUnsupported(f"input {position} is a symbolic {type(value).__name__} (only sizes may be)")
        if not isinstance(value, torch.Tensor):
            raise CaptureUnsupported(f"input {position} is a {type(value).__name__}, not a tensor")


def _specialize_constant_scalars(dynamo_graph: torch.fx.GraphModule, fakes: list[object],
                                 roles: list[InputRole]) -> None:
    """Ask dynamo to bake in the Python floats the model reads from itself or from globals.

    Under dynamic shapes dynamo passes such a float (a norm's ``eps``, RoPE's ``theta`` default) as a
    0-d tensor whose ``item()`` is symbolic; kopt's rewrites need them as numbers (an RMSNorm's eps).
    Specializing them is torch's own mechanism (Inductor's scalar pass does the same): record the
    symbols and restart dynamo's analysis, which then traces them as constants guarded on their value.
    A float passed as a forward argument stays symbolic: it may change on every call."""
    names = []
    for node, fake, role in zip((n for n in dynamo_graph.graph.nodes if n.op == "placeholder"), fakes, roles,
                                strict=True):
        fixed = role.role is Role.CONSTANT or role.source.startswith("G[")
        if fixed and node.users and all(u.op == "call_method" and u.target == "item" for u in node.users):
            name = tensorified_scalar(fake)
            if name is not None:
                names.append(name)
    restart_specializing(names)


def _identity(tensor: object) -> tuple | None:
    """Storage, offset, shape, stride, dtype: the same data whatever Tensor object wraps it (make_fx
    stores its own handle on the constants it closes over)."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
        return None
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride(),
            tensor.dtype)


def capture(dynamo_graph: torch.fx.GraphModule, example_inputs: list[object],
            roles: list[InputRole], *, in_dynamo: bool = True) -> CapturedGraph:
    """Trace ``dynamo_graph`` to a functional ATen graph with constants frozen as ``get_attr``.

    ``in_dynamo``: called from dynamo's compilation of the frame, which may be restarted (to
    specialize the module's floats); False when a compiled graph captures again after a weight change."""
    fakes = dynamo_fakes(dynamo_graph, example_inputs)
    _check_supported(example_inputs, symbolic=fakes is not None)
    live = set()  # inputs traced as inputs although they are module state
    if fakes is not None and in_dynamo:
        _specialize_constant_scalars(dynamo_graph, fakes, roles)
    if fakes is not None:
        # a float of the module that stayed symbolic: dynamo builds a new 0-d tensor for it on every
        # call, so it is passed along instead of frozen (and checked as a weight)
        live = {r.index for r in roles if tensorified_scalar(fakes[r.index]) is not None}
    frozen_roles = [r for r in roles if r.role is Role.CONSTANT and r.index not in live]
    # a size of a module's buffer is frozen at its value like the buffer itself
    frozen = {r.index: concrete(example_inputs[r.index]) for r in frozen_roles}
    if fakes is not None:  # dynamo's mode memoizes the fakes it made of these tensors, some with symbolic
        # sizes (buffers); a constant has the sizes it has: trace a fresh alias of the same storage
        frozen = {i: v.detach() if isinstance(v, torch.Tensor) else v for i, v in frozen.items()}
    constants = [(i, v) for i, v in frozen.items() if isinstance(v, torch.Tensor)]
    user_indices = [r.index for r in roles if r.role is not Role.CONSTANT or r.index in live]

    def with_frozen_constants(*user: torch.Tensor) -> object:
        args = list(example_inputs)
        for position, value in zip(user_indices, user, strict=True):
            args[position] = value
        for position, value in frozen.items():
            args[position] = value
        return dynamo_graph(*args)

    tracer = make_fx(torch.func.functionalize(with_frozen_constants, remove="mutations"),
                     tracing_mode="real", _allow_non_fake_inputs=True)
    if fakes is None:
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake_user = [fake_mode.from_tensor(example_inputs[i]) for i in user_indices]  # type: ignore[arg-type]
        with torch.no_grad(), fake_mode:
            graph_module = tracer(*fake_user)
    else:  # dynamo's fakes, in dynamo's mode: symbolic sizes, guards installed by dynamo
        from torch._subclasses.functional_tensor import FunctionalTensorMode, dispatch_functionalize
        tracer = make_fx(dispatch_functionalize(with_frozen_constants, FunctionalTensorMode()),
                         tracing_mode="real", _allow_non_fake_inputs=True)
        fake_mode = fake_mode_of(fakes) or FakeTensorMode(allow_non_fake_inputs=True)
        with torch.no_grad(), allowing_real_constants(fake_mode), fake_mode:
            graph_module = tracer(*[fakes[i] for i in user_indices])

    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    for node, position in zip(placeholders, user_indices, strict=True):
        node.meta["kopt_role"] = roles[position].role
        node.meta["kopt_source"] = roles[position].source
    paths = {_identity(example_inputs[r.index]): r.module_path for r in roles if r.role is Role.CONSTANT}
    for node in graph_module.graph.nodes:
        if node.op == "get_attr":
            node.meta["kopt_role"] = Role.CONSTANT
            # the module path of a parameter (``blocks.0.attn.to_q.weight``), for options that
            # select layers by name (fp8 include/skip); None for tensors traced as constants
            path = paths.get(_identity(constant_value(node)))
            if path is not None:
                node.meta["kopt_param"] = path
    return CapturedGraph(graph_module, roles, user_indices, constants)


def trace_function(fn: object, *example_inputs: torch.Tensor) -> torch.fx.GraphModule:
    """Capture a plain function the way :func:`capture` captures a model (for tests and tools):
    functional ATen, FakeTensor ``meta["val"]`` on every node, tensors it closes over as constants."""
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [fake_mode.from_tensor(t) for t in example_inputs]
    tracer = make_fx(torch.func.functionalize(fn, remove="mutations"), tracing_mode="real",  # type: ignore[arg-type]
                     _allow_non_fake_inputs=True)
    with torch.no_grad(), fake_mode:
        return tracer(*fakes)
