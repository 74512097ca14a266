"""torch.compile's ``mode=`` reaches kopt and maps onto its options (CUDA graphs, Inductor's autotuning)."""

from __future__ import annotations

import pytest
import torch

import kopt
from kopt.config import CompileOptions, Lowering, mode_options
from tests.conftest import rel_err


class Siblings(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

    def forward(self, x):
        return self.q(x) * self.k(x)


def test_each_mode_maps_onto_cuda_graphs_and_inductor_options():
    assert mode_options("default") == (None, {})
    assert mode_options("reduce-overhead") == (True, {})
    graphs, inductor = mode_options("max-autotune")
    assert graphs is True and inductor["max_autotune"] is True and "triton.cudagraphs" not in inductor
    graphs, inductor = mode_options("max-autotune-no-cudagraphs")
    assert graphs is False and inductor["max_autotune"] is True
    with pytest.raises(ValueError, match="max-autotune"):
        mode_options("fastest")


def test_an_explicit_cuda_graphs_wins_over_the_mode():
    assert CompileOptions(mode="reduce-overhead").use_cuda_graphs
    assert not CompileOptions(mode="reduce-overhead", cuda_graphs=False).use_cuda_graphs
    assert not CompileOptions(mode="max-autotune-no-cudagraphs").use_cuda_graphs
    assert CompileOptions(mode="default").use_cuda_graphs is True  # kopt's default: on for Inductor
    assert not CompileOptions(mode="default", lower=Lowering.EAGER).use_cuda_graphs


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune-no-cudagraphs"])
def test_a_mode_combines_with_kopt_options(mode):
    """torch.compile refuses mode= and options= together; options={"mode": ...} carries both."""
    torch.manual_seed(0)
    model = Siblings().eval()
    compiled = torch.compile(model, backend="kopt", options={"mode": mode, "lower": "eager"})
    x = torch.randn(4, 32)
    with torch.no_grad():
        assert rel_err(compiled(x), model(x)) < 1e-6
    graph = kopt.last_backend_report().graphs[-1]  # one report per options in a process: ours is the last
    assert graph.fallback is None and sum(p.total_matches for p in graph.passes if p.name == "sibling-merge") == 1
    assert graph.cuda_graphs is None  # CPU inputs: nothing to replay whatever the mode


def test_kopt_compile_takes_a_mode_and_refuses_an_unknown_one():
    with pytest.raises(ValueError, match="mode='turbo'"):
        kopt.compile(Siblings(), mode="turbo")
    compiled = kopt.compile(Siblings().eval(), mode="max-autotune-no-cudagraphs", lower="eager")
    assert compiled._kopt_backend.options.inductor_options["max_autotune"] is True


def test_unknown_backend_options_name_the_known_ones():
    with pytest.raises(Exception, match="kopt's options are"):
        torch.compile(Siblings(), backend="kopt", options={"lowering": "eager"})(torch.randn(2, 32))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_torch_compile_forwards_every_mode_to_kopt(mode):
    """``torch.compile(m, backend="kopt", mode=...)`` runs, rewrites, and lowers with the mode's
    Inductor options (the report names them)."""
    torch.manual_seed(0)
    model = Siblings().eval()
    compiled = torch.compile(model, backend="kopt", mode=mode)
    x = torch.randn(4, 32)
    with torch.no_grad():
        assert rel_err(compiled(x), model(x)) < 1e-5
    graph = kopt.last_backend_report().graphs[-1]  # one report per options in a process: ours is the last
    assert graph.fallback is None and sum(p.total_matches for p in graph.passes if p.name == "sibling-merge") == 1
    assert ("max_autotune=True" in graph.lowering) == mode.startswith("max-autotune")
