"""The lowered graph's numeric contract: checked on first use against the higher-precision reference.

Broken lowerings are stand-ins for an Inductor bug: they lower as FX (fast on the CPU), then perturb
an output or drop a term. They must be caught, the graph must run as FX instead, and ``strict``
must raise. Inductor itself must pass, including where it is more accurate than eager bf16 (FLUX.1's
guidance, which eager rounds and Inductor does not).
"""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree

import kopt
import kopt.backend
from kopt.config import Lowering
from kopt.fx.aliasing import writes_in_place
from kopt.lower import lower as real_lower
from kopt.verify import relative_error
from tests import tiny_flux1
from tests.conftest import rel_err, tiny_model_and_inputs

aten = torch.ops.aten


def _perturbing(gm: torch.fx.GraphModule, inputs: list, lowering: Lowering, inductor_options=None):
    """"Inductor" runs the graph as FX and scales every floating output by 1 + 1e-4 (FX stays FX)."""
    run = real_lower(gm, inputs, Lowering.EAGER)
    if lowering is Lowering.EAGER:
        return run

    def perturbed(*args):
        return pytree.tree_map(lambda t: t * (1 + 1e-4) if isinstance(t, torch.Tensor) and t.is_floating_point()
                               else t, run(*args))

    return perturbed


def _dropping_a_residual(gm: torch.fx.GraphModule, inputs: list, lowering: Lowering, inductor_options=None):
    """"Inductor" lowers a copy of the graph with its last residual add (tensor + tensor, same shape)
    replaced by its first operand: a dropped term (FX stays FX)."""
    if lowering is Lowering.EAGER:
        return real_lower(gm, inputs, lowering)
    copy = torch.fx.GraphModule(gm, gm.graph.__deepcopy__())
    adds = [n for n in copy.graph.nodes if n.target is aten.add.Tensor
            and all(isinstance(a, torch.fx.Node) and a.meta["val"].shape == n.meta["val"].shape for a in n.args[:2])]
    if adds:
        adds[-1].replace_all_uses_with(adds[-1].args[0])
        copy.graph.erase_node(adds[-1])
        copy.recompile()
    return real_lower(copy, inputs, Lowering.EAGER)


@pytest.mark.parametrize("broken, dtype", [(_perturbing, torch.float32), (_dropping_a_residual, torch.bfloat16)])
def test_a_broken_lowering_is_caught_and_the_graph_runs_as_fx(monkeypatch, broken, dtype):
    """The check fails, the report says why, and the output is the rewritten graph's run as FX."""
    _workload, model, inputs = tiny_model_and_inputs("flux2", seed=5, dtype=dtype)
    with torch.no_grad():
        as_fx = kopt.compile(model, lower="eager")(**inputs)[0]
    torch._dynamo.reset()
    monkeypatch.setattr(kopt.compiled_graph, "lower", broken)
    # both stages through the broken lowering (a small step-invariant stage otherwise skips it): the term
    # dropped there moves the output well past the bound, where one dropped in the per-call stage's
    # three residual adds stays within bf16's
    monkeypatch.setattr(kopt.compiled_graph, "computed_in_float32", lambda *cost: False)
    compiled = kopt.compile(model)  # lower="inductor": checked by default
    with torch.no_grad():
        output = compiled(**inputs)[0]
        fresh = _workload.inputs("tiny", seed=6, dtype=dtype)
        again = compiled(**fresh)[0]
        eager_again = model(**fresh)[0]
    graph = compiled.kopt_report.graphs[0]
    check = graph.lowering_check
    assert not check.ok and check.fallback == "the rewritten graph runs as FX (op by op)"
    assert graph.lowering.startswith("eager (fallback: inductor failed the lowering check)")
    (verdict,) = check.outputs
    assert not verdict["ok"] and verdict["rel_err"] > 2 * verdict["baseline_rel_err"]
    assert torch.equal(output, as_fx)
    assert rel_err(again, eager_again) < (1e-5 if dtype is torch.float32 else 2e-2)
    assert "lowering check" in str(compiled.kopt_report) and "FAILED" in str(compiled.kopt_report)


def test_a_broken_lowering_of_the_original_graph_runs_it_op_by_op(monkeypatch):
    """No rewrite fired (``passes=[]``): the original graph's lowering is checked too."""
    _workload, model, inputs = tiny_model_and_inputs("qwen-image", seed=8)
    monkeypatch.setattr(kopt.compiled_graph, "lower", _perturbing)
    compiled = kopt.compile(model, passes=[])
    with torch.no_grad():
        assert torch.equal(compiled(**inputs)[0], model(**inputs)[0])
    assert compiled.kopt_report.graphs[0].lowering_check.fallback == "the original graph runs op by op"


def test_a_broken_lowering_raises_under_strict(monkeypatch):
    _workload, model, inputs = tiny_model_and_inputs("flux2", seed=9)
    monkeypatch.setattr(kopt.compiled_graph, "lower", _perturbing)
    compiled = kopt.compile(model, strict=True)
    with torch.no_grad(), pytest.raises(kopt.LoweringCheckFailed, match="failed its numeric check"):
        compiled(**inputs)


def test_the_check_can_be_turned_off_and_never_runs_for_fx(monkeypatch):
    """``check_lowering=False`` trusts the lowering (the broken one goes through, as it would without
    the check); ``lower="eager"`` has no lowering to check."""
    _workload, model, inputs = tiny_model_and_inputs("flux2", seed=10)
    monkeypatch.setattr(kopt.compiled_graph, "lower", _perturbing)
    unchecked = kopt.compile(model, check_lowering=False)
    with torch.no_grad():
        assert rel_err(unchecked(**inputs)[0], model(**inputs)[0]) > 5e-5
    assert unchecked.kopt_report.graphs[0].lowering_check is None
    torch._dynamo.reset()
    as_fx = kopt.compile(model, lower="eager")
    with torch.no_grad():
        as_fx(**inputs)
    assert as_fx.kopt_report.graphs[0].lowering_check is None


def test_a_graph_writing_in_place_is_not_rerun_by_the_check(monkeypatch):
    """Checking re-runs the first call; a forward that writes into a buffer is left unchecked (and the
    report says so), so the check adds no write: the count is what it is without the check."""
    class Accumulate(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls.add_(1)
            return self.linear(x) + self.linear(x)

    monkeypatch.setattr(kopt.compiled_graph, "lower", _perturbing)
    counts = []
    for check_lowering in (False, True):
        torch._dynamo.reset()
        module = Accumulate().eval()
        compiled = kopt.compile(module, check_lowering=check_lowering)
        with torch.no_grad():
            compiled(torch.randn(2, 8))
        counts.append(module.calls.item())
    check = compiled.kopt_report.graphs[0].lowering_check
    assert check.ok and "writes in place" in check.note and "writes in place" in str(compiled.kopt_report)
    assert counts[0] == counts[1]


def test_a_write_into_a_fresh_tensor_is_checked_a_write_into_an_input_is_not():
    """Only writes that may reach an input (through views and aliasing calls) stop the check."""
    def graph_of(fn):
        graphs = []
        torch._dynamo.reset()
        torch.compile(fn, backend=lambda gm, _inputs: graphs.append(gm) or gm)(torch.randn(3, 4))
        return graphs[0]

    def fresh(x):
        y = x.clone()
        y[:, 0] = 0
        return y.mul_(2) + 1

    def into_input(x):
        x.view(-1)[:2].add_(1)
        return x * 2

    def through_to(x):
        y = x.to(torch.float32)  # the same tensor when x is already float32
        y[0] = 0
        return y + 1

    assert writes_in_place(graph_of(fresh)) is None
    assert writes_in_place(graph_of(into_input)) is not None
    assert writes_in_place(graph_of(through_to)) is not None


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inductor_passes_its_check_on_tiny_dits(dtype):
    """The real lowering: Inductor on the default pipeline passes, and the report has its numbers."""
    _workload, model, inputs = tiny_model_and_inputs("qwen-image", seed=12, dtype=dtype)
    compiled = kopt.compile(model, strict=True)
    with torch.no_grad():
        output = compiled(**inputs)[0]
    graph = compiled.kopt_report.graphs[0]
    assert graph.lowering == "inductor" and graph.lowering_check.ok and graph.lowering_check.seconds > 0
    (check,) = graph.lowering_check.outputs
    assert check["rel_err"] <= 1.5 * check["baseline_rel_err"] + torch.finfo(dtype).eps
    assert 0 < check["eager_rel_err"] and check["rel_err_vs_eager"] is not None
    with torch.no_grad():
        assert relative_error(output, model(**inputs)[0]) < (1e-5 if dtype is torch.float32 else 3e-2)


@pytest.mark.slow
def test_inductor_more_accurate_than_eager_on_flux1_guidance_passes():
    """FLUX.1 with guidance 3.5 in bf16: eager rounds 3500 to 3504, Inductor does not. Inductor is far
    from eager and much closer to the reference; the check passes and the report says why they differ."""
    model, inputs = tiny_flux1.model_and_inputs(torch.bfloat16, guidance=3.5)
    compiled = kopt.compile(model, strict=True)
    with torch.no_grad():
        output, eager = compiled(**inputs)[0], model(**inputs)[0]
    graph = compiled.kopt_report.graphs[0]
    (check,) = graph.lowering_check.outputs
    assert graph.lowering == "inductor" and graph.lowering_check.ok
    assert check["rel_err"] < check["eager_rel_err"] / 3  # Inductor is the more accurate
    assert check["rel_err_vs_eager"] > 1e-2 and relative_error(output, eager) > 1e-2  # and far from eager
    assert any(h.example == (3500.0, 3504.0) for h in graph.hazards)
