"""kopt's passes as an Inductor post-grad custom pass (what vLLM uses), on plain torch.compile: rewrites in
Inductor's own graph, Inductor still compiles, outputs keep the contract; a failing kopt pass changes nothing."""

from __future__ import annotations

import pytest
import torch

from kopt.integrations.inductor_pass import KoptPostGradPass
from kopt.passes.base import Contract, FunctionPass
from tests.conftest import rel_err


class Block(torch.nn.Module):
    """A linear, a reshape round trip and one RMSNorm computed twice (redundant work for kopt's CSE)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.norm = torch.nn.Linear(32, 32), torch.nn.RMSNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x).view(2, 8, 32).reshape(16, 32)
        return self.norm(h) * torch.sigmoid(h) + self.norm(h)


def _compile_with(kopt_pass: KoptPostGradPass, x: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)
    model = Block().eval()
    with torch._inductor.config.patch(post_grad_custom_post_pass=kopt_pass, fx_graph_cache=False), torch.no_grad():
        out = torch.compile(model, backend="inductor")(x)
        reference = model.double()(x.double())
    return out, reference


@pytest.mark.slow
def test_post_grad_pass_rewrites_inductors_graph_and_inductor_compiles():
    kopt_pass = KoptPostGradPass()
    x = torch.randn(16, 32)
    out, reference = _compile_with(kopt_pass, x)
    assert len(kopt_pass.report.graphs) == 1 and kopt_pass.report.graphs[0].fallback is None
    assert kopt_pass.rewrites()["redundancy"] > 0  # the second norm(h) and the identity reshapes
    assert rel_err(out, reference) < 1e-5
    assert "fuse-adaln: no candidate in the graph" in kopt_pass.why_not()


@pytest.mark.slow
def test_a_failing_kopt_pass_leaves_inductor_compiling():
    def explode(graph_module, ctx):
        graph_module.graph.erase_node(next(n for n in graph_module.graph.nodes if n.op == "output"))
        raise RuntimeError("a bug in a kopt rewrite")

    kopt_pass = KoptPostGradPass([FunctionPass("explode", "raises mid-rewrite", Contract.exact(), explode)])
    out, reference = _compile_with(kopt_pass, torch.randn(16, 32))
    assert kopt_pass.report.graphs[0].passes[0].status.startswith("skipped: RuntimeError")
    assert rel_err(out, reference) < 1e-5


def test_uuid_names_the_passes_and_the_switch():
    """Inductor's FX graph cache keys on uuid(): a different pass list or a pass turned off is another key."""
    default, other = KoptPostGradPass(), KoptPostGradPass(["redundancy"])
    assert default.uuid() == KoptPostGradPass().uuid() != other.uuid()
    other.disabled = "turned off"
    assert other.uuid() != KoptPostGradPass(["redundancy"]).uuid()
    graph = torch.fx.symbolic_trace(lambda x: (x + 1) + (x + 1))
    text = str(graph.graph)
    other(graph.graph)
    assert str(graph.graph) == text and "turned off" in other.report.graphs[-1].fallback
