"""What kopt hands Inductor for a graph with symbolic sizes (:func:`kopt.fx.symbolic.lowering_examples`).

A real tensor that reaches Inductor inside a dynamo compile is faked with a fresh size symbol per
dimension; a guard on such a symbol has no source, and dynamo then fails to build the frame's guards
(whole-model FP8 at a second shape, seen on the H200 in s19a). So every tensor of a symbolic graph
must reach Inductor as a fake of the graph's own mode.
"""

from __future__ import annotations

import torch
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from kopt.fx.symbolic import lowering_examples


def _graph_with_a_size_input(mode: FakeTensorMode, n: torch.SymInt, x: torch.Tensor, w: torch.Tensor):
    graph = torch.fx.Graph()
    xs, ns, ws = graph.placeholder("x"), graph.placeholder("n"), graph.placeholder("w")
    graph.output(graph.call_function(torch.mul, (graph.call_function(torch.matmul, (xs, ws)), ns)))
    xs.meta["val"] = mode.from_tensor(x, static_shapes=True)
    ns.meta["val"] = n
    ws.meta["val"] = mode.from_tensor(w, static_shapes=True)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_a_graph_whose_only_symbol_is_a_size_input_gets_static_fakes_of_its_mode():
    shape_env = ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env)
    n = shape_env.create_symintnode(shape_env.create_symbol(6, ConstantSource("n")), hint=6)
    x, w = torch.randn(8, 6), torch.randn(6, 5)
    graph_module = _graph_with_a_size_input(mode, n, x, w)
    symbols_before = set(shape_env.var_to_val)

    examples = lowering_examples(graph_module, [x, n, w])

    tensors = [examples[0], examples[2]]
    assert all(isinstance(t, FakeTensor) and t.fake_mode is mode for t in tensors), examples
    assert [tuple(t.shape) for t in tensors] == [(8, 6), (6, 5)]
    assert all(isinstance(d, int) for t in tensors for d in t.shape)  # static: no size symbol to guard on
    assert examples[1] is n
    assert set(shape_env.var_to_val) == symbols_before


def test_a_constant_faked_in_a_mode_of_its_own_does_not_decide_the_mode():
    """A pass that adds a constant fakes it in a throwaway mode; made an input, its placeholder comes
    first here, and the graph's sizes still belong to the mode of the symbols."""
    shape_env = ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env)
    n = shape_env.create_symintnode(shape_env.create_symbol(6, ConstantSource("n")), hint=6)
    x, w = torch.randn(8, 6), torch.randn(6, 5)
    graph_module = _graph_with_a_size_input(mode, n, x, w)
    first = next(iter(graph_module.graph.nodes))
    first.meta["val"] = FakeTensorMode(allow_non_fake_inputs=True).from_tensor(x)  # the throwaway mode

    examples = lowering_examples(graph_module, [x, n, w])

    assert all(isinstance(examples[i], FakeTensor) and examples[i].fake_mode is mode for i in (0, 2)), examples
    assert [tuple(examples[i].shape) for i in (0, 2)] == [(8, 6), (6, 5)]


def test_a_static_graph_outside_dynamo_gets_its_real_inputs():
    x, w = torch.randn(8, 6), torch.randn(6, 5)
    mode = FakeTensorMode()
    graph_module = _graph_with_a_size_input(mode, 3, x, w)  # type: ignore[arg-type]

    examples = lowering_examples(graph_module, [x, 3, w])

    assert examples[0] is x and examples[1] == 3 and examples[2] is w
