"""kopt.compile accepts a plain function or lambda, as torch.compile does, and says what it expects otherwise."""

from __future__ import annotations

import pytest
import torch

import kopt
from tests.conftest import rel_err


def _twice_gelu(x):
    # the same subexpression twice: the redundancy pass fires on a function as on a module
    return torch.nn.functional.gelu(x) + torch.nn.functional.gelu(x)


def test_a_function_compiles_and_reports():
    compiled = kopt.compile(_twice_gelu, lower="eager")
    x = torch.randn(4, 32)
    assert rel_err(compiled(x), _twice_gelu(x)) < 1e-6
    assert compiled.kopt_report.matches("redundancy") > 0 and compiled.kopt_report.graphs[0].fallback is None
    assert compiled.__name__ == "_twice_gelu" and compiled.__wrapped__ is _twice_gelu


def test_a_lambda_with_keyword_arguments():
    compiled = kopt.compile(lambda x, *, scale: torch.relu(x) * scale + torch.relu(x), lower="eager")
    x = torch.randn(3, 8)
    assert rel_err(compiled(x, scale=torch.tensor(2.0)), torch.relu(x) * 3) < 1e-6


def test_tensors_a_function_closes_over_are_read_every_call():
    """As with torch.compile, a closed-over tensor is an input of the graph, not a frozen constant."""
    weight = torch.randn(8, 8)

    def project(x):
        return torch.relu(x @ weight) + torch.relu(x @ weight)

    compiled = kopt.compile(project, lower="eager")
    x = torch.randn(2, 8)
    assert rel_err(compiled(x), project(x)) < 1e-6
    weight.mul_(-2.0)
    assert rel_err(compiled(x), project(x)) < 1e-6


def test_a_by_example_rule_on_a_function_keeps_integer_inputs_exact():
    """A float rule on an int64 function: declined (a near miss), and the output stays eager's."""
    rule = kopt.Rule("mul-sigmoid→silu", lambda x: x * torch.sigmoid(x), lambda x: torch.nn.functional.silu(x),
                     example=lambda: (torch.randn(8, 16),), why="silu(x) is defined as x * sigmoid(x)")
    fuse = kopt.RewritePass("fuse-silu", "one kernel instead of two", kopt.Contract.tolerance(1e-5), [rule])
    compiled = kopt.compile(lambda x: x * torch.sigmoid(x), passes=[fuse], lower="eager")
    x = torch.arange(-6, 6)
    assert torch.equal(compiled(x), x * torch.sigmoid(x))
    record = compiled.kopt_report.pass_records("fuse-silu")[0]
    assert record.total_matches == 0 and "int64" in record.near_misses[0].reason


def test_what_is_not_callable_is_refused_with_what_is_expected():
    with pytest.raises(TypeError, match="torch.nn.Module or a function"):
        kopt.compile(torch.randn(3))


def test_release_weights_needs_a_module():
    with pytest.raises(ValueError, match="function has none"):
        kopt.compile(_twice_gelu, release_weights=True)
