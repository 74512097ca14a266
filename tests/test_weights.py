"""Weights changed after compiling: recompile (default), raise, ignore, or kopt_refresh()."""

from __future__ import annotations

import pytest
import torch

import kopt
from tests.conftest import rel_err


class TwoLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x):
        # the same product twice, so that the redundancy pass fires and weights are frozen
        return self.b(torch.relu(self.a(x))) + self.b(torch.relu(self.a(x)))


def _compiled(policy):
    model = TwoLayer().eval()
    compiled = kopt.compile(model, lower="eager", on_weight_change=policy)
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert rel_err(compiled(x), model(x)) < 1e-6
    assert compiled.kopt_report.matches("redundancy") > 0
    return model, compiled, x


def test_recompile_by_default_after_in_place_update():
    """load_state_dict-style in-place writes are detected and the graph is rebuilt."""
    model, compiled, x = _compiled("recompile")
    with torch.no_grad():
        model.a.weight.mul_(-1.5)
        assert rel_err(compiled(x), model(x)) < 1e-6
    assert compiled.kopt_report.graphs[0].weight_refreshes == 1


def test_recompile_after_load_state_dict():
    model, compiled, x = _compiled("recompile")
    other = TwoLayer().eval()
    model.load_state_dict(other.state_dict())
    with torch.no_grad():
        assert rel_err(compiled(x), other(x)) < 1e-6


def test_raise_policy_names_the_fix():
    model, compiled, x = _compiled(kopt.WeightChange.RAISE)
    with torch.no_grad():
        model.b.bias.add_(1.0)
        with pytest.raises(kopt.WeightsChangedError, match="kopt_refresh"):
            compiled(x)
        compiled.kopt_refresh()
        assert rel_err(compiled(x), model(x)) < 1e-6


def test_ignore_policy_skips_the_check():
    """No rebuild happens; the graph reads whatever the captured tensors hold now."""
    model, compiled, x = _compiled("ignore")
    with torch.no_grad():
        model.b.bias.add_(1.0)
        compiled(x)
    assert compiled.kopt_report.graphs[0].weight_refreshes == 0


def test_replaced_parameter_object_is_detected():
    """Assigning a new Parameter (not an in-place write) is caught too."""
    model, compiled, x = _compiled("recompile")
    with torch.no_grad():
        model.a.weight = torch.nn.Parameter(torch.randn(16, 16))
        assert rel_err(compiled(x), model(x)) < 1e-6
