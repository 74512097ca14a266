"""kopt.fx.roles reads dynamo's source objects: module state (with its parameter path), forward
arguments by keyword, by position through a ``*args`` wrapper and inside ``**kwargs``, sizes, and an
input it cannot place (a global tensor), which stays per-call and is reported loudly."""

from __future__ import annotations

import logging

import torch

import kopt
from kopt.config import Role
from kopt.fx.roles import UNCLASSIFIED, classify_inputs

GLOBAL_OFFSET = torch.randn(8)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.register_buffer("shift", torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.shift


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.scale = torch.nn.Parameter(torch.randn(8))

    def forward(self, hidden, timestep, *rest, guidance=None, **extra):
        for block in self.blocks:
            hidden = block(hidden)
        return hidden * self.scale + timestep + rest[0] + guidance + extra["context"]


def _roles(fn, *args, positional=(), **kwargs):
    found = []

    def backend(graph_module, example_inputs):
        placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
        found.extend(classify_inputs(placeholders, example_inputs, {"context": Role.STEP_INVARIANT}, positional))
        return graph_module

    torch._dynamo.reset()
    torch.compile(fn, backend=backend)(*args, **kwargs)
    return found


def test_module_state_carries_its_parameter_path_and_arguments_their_names():
    model = Model()
    inputs = [torch.randn(2, 8) for _ in range(5)]
    roles = _roles(model, *inputs[:3], guidance=inputs[3], context=inputs[4])
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    constants = [r for r in roles if r.role is Role.CONSTANT]
    assert {r.module_path for r in constants} == set(state)  # every weight, each found by its path
    arguments = {r.argument: (r.role, r.reason) for r in roles if r.role is not Role.CONSTANT}
    assert arguments["hidden"][0] is Role.PER_CALL
    assert arguments["timestep"][0] is Role.STEP_INVARIANT and "timestep" in arguments["timestep"][1]
    assert arguments["guidance"][0] is Role.STEP_INVARIANT
    assert arguments["context"] == (Role.STEP_INVARIANT, "given in roles=")  # a **kwargs entry, named
    assert "rest" in arguments  # the varargs local read by item: named after the local
    assert not any(r.reason.startswith(UNCLASSIFIED) for r in roles)


def test_positional_arguments_of_a_varargs_wrapper_get_the_forward_names():
    def wrapper(*args):
        return args[0] * 2 + args[1]

    roles = _roles(wrapper, torch.randn(4), torch.randn(4), positional=("latents", "timestep"))
    assert [(r.argument, r.role) for r in roles] == [("latents", Role.PER_CALL), ("timestep", Role.STEP_INVARIANT)]


def test_sizes_of_dynamic_shapes_are_step_invariant_and_named_after_their_tensor():
    def scaled(x):
        return x * x.shape[0]

    torch._dynamo.reset()
    found = []

    def backend(graph_module, example_inputs):
        placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
        found.extend(classify_inputs(placeholders, example_inputs, {}))
        return graph_module

    torch.compile(scaled, backend=backend, dynamic=True)(torch.randn(5))
    sizes = [r for r in found if r.role is Role.STEP_INVARIANT]
    assert sizes and all(r.argument == "x" and "size" in r.reason for r in sizes)


def test_an_input_that_is_neither_state_nor_argument_is_per_call_and_reported_loudly(caplog):
    def reads_a_global(x):
        return x + GLOBAL_OFFSET

    roles = _roles(reads_a_global, torch.randn(8))
    unclassified = [r for r in roles if r.reason.startswith(UNCLASSIFIED)]
    assert len(unclassified) == 1 and unclassified[0].role is Role.PER_CALL
    assert "GLOBAL_OFFSET" in unclassified[0].source

    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING, logger="kopt"):
        compiled = kopt.compile(reads_a_global, lower="eager")
        x = torch.randn(8)
        torch.testing.assert_close(compiled(x), x + GLOBAL_OFFSET)
    assert "UNCLASSIFIED inputs" in str(compiled.kopt_report)
    assert any(UNCLASSIFIED in record.getMessage() for record in caplog.records)
