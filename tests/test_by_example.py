"""Rules by example: fire by what the graph computes, match numbers, decline with reasons."""

from __future__ import annotations

import torch

import kopt
from kopt.fx.capture import trace_function
from kopt.passes.base import PassContext
from tests.conftest import rel_err

aten = torch.ops.aten


def _gelu_tanh_by_hand(x):
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def _gelu_tanh(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


GELU_RULE = kopt.Rule("gelu-tanh", _gelu_tanh_by_hand, _gelu_tanh, example=lambda: (torch.randn(16),),
                      why="the tanh approximation of GELU, written out")
GELU_PASS = kopt.RewritePass("gelu", "one op instead of eight", kopt.Contract.tolerance(1e-5), [GELU_RULE])


def test_rule_fires_on_each_occurrence_and_matches_numbers():
    """Both hand-written GELUs (different shapes) become aten.gelu; outputs within 1e-5."""
    def model_fn(x, y):
        return _gelu_tanh_by_hand(x).sum() + _gelu_tanh_by_hand(y @ y.T).sum()

    x, y = torch.randn(7, 5), torch.randn(9, 3)
    graph_module = trace_function(model_fn, x, y)
    ctx = PassContext("gelu")
    GELU_PASS.apply(graph_module, ctx)
    graph_module.recompile()
    assert ctx.matches == {"gelu-tanh": 2}
    targets = [n.target for n in graph_module.graph.nodes]
    assert targets.count(aten.gelu.default) == 2 and aten.tanh.default not in targets
    gelus = [n for n in graph_module.graph.nodes if n.target is aten.gelu.default]
    assert all(n.meta["kopt_provenance"] == ["gelu:gelu-tanh"] for n in gelus)
    x, y = torch.randn(7, 5), torch.randn(9, 3)
    assert rel_err(graph_module(x, y), model_fn(x, y)) < 1e-5


def test_rule_inside_compile_on_a_module():
    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(32, 64)

        def forward(self, x):
            return _gelu_tanh_by_hand(self.fc(x))

    model = MLP().eval()
    compiled = kopt.compile(model, passes=[GELU_PASS], lower="eager", verify=True)
    x = torch.randn(5, 32)
    with torch.no_grad():
        assert rel_err(compiled(x), model(x)) < 1e-5
    assert compiled.kopt_report.matches("gelu") == 1
    assert compiled.kopt_report.graphs[0].fallback is None


def test_guard_declines_and_does_not_touch_the_graph():
    """A guard's reason becomes a near miss and the pattern stays in place."""
    rule = kopt.Rule("gelu-tanh", _gelu_tanh_by_hand, _gelu_tanh, example=lambda: (torch.randn(16),),
                     why="test", guard=lambda m: "only bf16 inputs are worth it")
    graph_module = trace_function(_gelu_tanh_by_hand, torch.randn(4))
    ctx = PassContext("gelu")
    kopt.RewritePass("gelu", "t", kopt.Contract.exact(), [rule]).apply(graph_module, ctx)
    assert ctx.matches == {} and [m.reason for m in ctx.near_misses] == ["only bf16 inputs are worth it"]
    assert any(n.target is aten.tanh.default for n in graph_module.graph.nodes)


def test_pattern_does_not_match_a_different_computation():
    """x * sigmoid(2x) is not silu: the rule must not fire."""
    rule = kopt.Rule("silu", lambda x: x * torch.sigmoid(x), torch.nn.functional.silu,
                     example=lambda: (torch.randn(8),), why="silu definition")
    graph_module = trace_function(lambda x: x * torch.sigmoid(2 * x), torch.randn(8))
    ctx = PassContext("silu")
    kopt.RewritePass("silu", "t", kopt.Contract.exact(), [rule]).apply(graph_module, ctx)
    assert ctx.matches == {}


def test_a_library_function_with_optional_parameters_is_a_replacement():
    """``replacement=torch.nn.functional.silu`` (signature ``input, inplace=False``) is traced with the
    example's one argument, as README's "Writing a pass" writes it."""
    rule = kopt.Rule("mul-sigmoid→silu", lambda x: x * torch.sigmoid(x), torch.nn.functional.silu,
                     example=lambda: (torch.randn(8, 16),), why="silu(x) is defined as x * sigmoid(x)")
    graph_module = trace_function(lambda x: (x * torch.sigmoid(x)).sum(), torch.randn(3, 5))
    ctx = PassContext("fuse-silu")
    kopt.RewritePass("fuse-silu", "one op", kopt.Contract.tolerance(1e-5), [rule]).apply(graph_module, ctx)
    graph_module.recompile()
    assert ctx.matches == {"mul-sigmoid→silu": 1}
    targets = [n.target for n in graph_module.graph.nodes]
    assert aten.silu.default in targets and aten.sigmoid.default not in targets
    x = torch.randn(3, 5)
    assert rel_err(graph_module(x), (x * torch.sigmoid(x)).sum()) < 1e-5


def _silu_rule(**extra):
    return kopt.Rule("mul-sigmoid→silu", lambda x: x * torch.sigmoid(x), lambda x: torch.nn.functional.silu(x),
                     example=lambda: (torch.randn(8, 16),), why="silu(x) is defined as x * sigmoid(x)", **extra)


def _apply(rule, *inputs):
    graph_module = trace_function(lambda x: x * torch.sigmoid(x), *inputs)
    ctx = PassContext("fuse-silu")
    kopt.RewritePass("fuse-silu", "t", kopt.Contract.tolerance(1e-5), [rule]).apply(graph_module, ctx)
    return graph_module, ctx


def test_a_rule_traced_on_floats_declines_integer_inputs_with_a_reason():
    """x * sigmoid(x) of an int64 x is a float tensor; silu(x) of it is not the same computation."""
    graph_module, ctx = _apply(_silu_rule(), torch.arange(-4, 4))
    assert ctx.matches == {}
    assert len(ctx.near_misses) == 1 and "int64" in ctx.near_misses[0].reason
    assert any(n.target is aten.sigmoid.default for n in graph_module.graph.nodes)


def test_a_rule_traced_on_fp32_matches_every_floating_dtype():
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        _, ctx = _apply(_silu_rule(), torch.randn(4, 16, dtype=dtype))
        assert ctx.matches == {"mul-sigmoid→silu": 1}, dtype


def test_dtypes_says_exactly_which_dtypes_a_rule_may_match():
    _, ctx = _apply(_silu_rule(dtypes={torch.float32}), torch.randn(4, 16, dtype=torch.bfloat16))
    assert ctx.matches == {} and "bfloat16" in ctx.near_misses[0].reason
    _, ctx = _apply(_silu_rule(dtypes={torch.float32}), torch.randn(4, 16))
    assert ctx.matches == {"mul-sigmoid→silu": 1}
