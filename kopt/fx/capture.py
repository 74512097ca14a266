"""Capture: turn dynamo's torch-level graph into a functional ATen graph with frozen constants.

Why ATen and not dynamo's torch IR: the torch IR spells one computation many ways (``F.linear``,
``x @ w.T``, ``x.view`` / ``torch.reshape``, in-place ``add_``); after ``make_fx`` +
``functionalize`` each has one canonical, side-effect-free spelling (``mm``/``addmm`` on a
constant, ``view``), so a pass matches what the graph *computes*. Parameters and buffers are
closed over while tracing and so become ``get_attr`` constants that passes may concatenate,
quantize or fold. Tracing runs under FakeTensor, so every node carries ``meta["val"]``
(shape, dtype, device) and nothing real is computed.
"""

from __future__ import annotations

import dataclasses

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from kopt.config import Role
from kopt.fx.constants import constant_value
from kopt.fx.roles import InputRole, module_path


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


def _check_supported(example_inputs: list[object]) -> None:
    for position, value in enumerate(example_inputs):
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise CaptureUnsupported(f"input {position} is a symbolic scalar (dynamic shapes)")
        if isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in value.shape):
            raise CaptureUnsupported(f"input {position} has a symbolic shape (dynamic shapes)")
        if not isinstance(value, torch.Tensor):
            raise CaptureUnsupported(f"input {position} is a {type(value).__name__}, not a tensor")


def _identity(tensor: object) -> tuple | None:
    """Storage, offset, shape, stride, dtype: the same data whatever Tensor object wraps it (make_fx
    stores its own handle on the constants it closes over)."""
    if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
        return None
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride(),
            tensor.dtype)


def capture(dynamo_graph: torch.fx.GraphModule, example_inputs: list[object],
            roles: list[InputRole]) -> CapturedGraph:
    """Trace ``dynamo_graph`` to a functional ATen graph with constants frozen as ``get_attr``."""
    _check_supported(example_inputs)
    constants = [(r.index, example_inputs[r.index]) for r in roles if r.role is Role.CONSTANT]
    user_indices = [r.index for r in roles if r.role is not Role.CONSTANT]
    frozen = dict(constants)

    def with_frozen_constants(*user: torch.Tensor) -> object:
        args = list(example_inputs)
        for position, value in zip(user_indices, user, strict=True):
            args[position] = value
        for position, value in frozen.items():
            args[position] = value
        return dynamo_graph(*args)

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_user = [fake_mode.from_tensor(example_inputs[i]) for i in user_indices]  # type: ignore[arg-type]
    tracer = make_fx(torch.func.functionalize(with_frozen_constants, remove="mutations"),
                     tracing_mode="real", _allow_non_fake_inputs=True)
    with torch.no_grad(), fake_mode:
        graph_module = tracer(*fake_user)

    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    for node, position in zip(placeholders, user_indices, strict=True):
        node.meta["kopt_role"] = roles[position].role
        node.meta["kopt_source"] = roles[position].source
    sources = {_identity(example_inputs[r.index]): r.source for r in roles if r.role is Role.CONSTANT}
    for node in graph_module.graph.nodes:
        if node.op == "get_attr":
            node.meta["kopt_role"] = Role.CONSTANT
            # the module path of a parameter (``blocks.0.attn.to_q.weight``), for options that
            # select layers by name (fp8 include/skip); None for tensors traced as constants
            path = module_path(sources.get(_identity(constant_value(node)), ""))
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
