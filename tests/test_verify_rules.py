"""The acceptance rules of kopt.verify: contracts measured against a higher-precision reference.

Synthetic outputs with known errors: ``r`` the reference, ``e`` eager (``r`` plus rounding-sized
noise), candidates at chosen distances. Then the rules on a real model through ``verify=True``.
"""

from __future__ import annotations

import math

import torch

import kopt
from kopt.fp8 import QualityGate
from kopt.fp8.quality import judge
from kopt.passes.base import Contract
from kopt.verify import LoweringRule, compare, relative_error
from tests import tiny_flux1

aten = torch.ops.aten


def _outputs(eager_err: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(reference, eager at relative distance ``eager_err``), float32 values of a 4096-vector."""
    generator = torch.Generator().manual_seed(seed)
    reference = torch.randn(4096, generator=generator, dtype=torch.float64)
    return reference, _moved(reference, eager_err, seed + 1)


def _moved(reference: torch.Tensor, err: float, seed: int) -> torch.Tensor:
    """``reference`` plus random noise of relative norm ``err`` (float32)."""
    noise = torch.randn(reference.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (reference + noise * (err * reference.norm() / noise.norm())).float()


def test_more_accurate_than_eager_passes_however_far_from_eager():
    """Eager 0.045 off (FLUX.1's bf16 guidance), candidate 0.007: 0.045 from eager, over a 0.01 budget
    measured against eager; it passes against the reference."""
    reference, eager = _outputs(0.045)
    candidate = _moved(reference, 0.007, 7)
    assert relative_error(candidate, eager) > 0.01  # the old rule (distance to eager <= 0.01) rejects it
    (check,) = compare(candidate, eager, Contract.tolerance(1e-2), reference=reference)
    assert check.ok and "more accurate than eager" in check.verdict
    assert math.isclose(check.rel_err, 0.007, rel_tol=1e-3) and math.isclose(check.eager_rel_err, 0.045, rel_tol=1e-3)
    assert check.rel_err_vs_eager > 0.04  # both numbers are reported


def test_less_accurate_than_eager_passes_only_within_its_budget_and_says_so():
    reference, eager = _outputs(0.004)
    within = _moved(reference, 0.004 + 0.008, 3)  # 0.008 worse than eager, budget 0.01
    beyond = _moved(reference, 0.004 + 0.02, 4)  # 0.02 worse: past the budget
    (ok,) = compare(within, eager, Contract.tolerance(1e-2), reference=reference)
    (bad,) = compare(beyond, eager, Contract.tolerance(1e-2), reference=reference)
    assert ok.ok and "less accurate than eager" in ok.verdict
    assert not bad.ok and "less accurate than eager" in bad.verdict and "VIOLATION" in bad.verdict


def test_zeros_and_nan_fail_whatever_the_budget():
    reference, eager = _outputs(0.01)
    (zeros,) = compare(torch.zeros_like(eager), eager, Contract.tolerance(0.5), reference=reference)
    nan = eager.clone()
    nan[3] = math.nan
    (poisoned,) = compare(nan, eager, Contract.tolerance(0.5), reference=reference)
    assert not zeros.ok and zeros.rel_err == 1.0
    assert not poisoned.ok and "NaN" in poisoned.verdict


def test_an_output_with_no_finite_value_to_compare_fails_instead_of_passing_vacuously():
    """NaN where the original is NaN is not an error, but when nothing finite is left (an original fed
    a NaN mask) no contract has been checked: such a check must not count as a pass."""
    reference, eager = _outputs(0.01)
    for where in ("baseline", "reference"):
        nan_eager = torch.full_like(eager, math.nan) if where == "baseline" else eager
        nan_reference = torch.full_like(reference, math.nan) if where == "reference" else reference
        candidate = nan_eager.clone()  # NaN only where the original is
        (check,) = compare(candidate, nan_eager, Contract.tolerance(0.5), reference=nan_reference)
        assert not check.ok and "no value to compare" in check.verdict
    partly = eager.clone()
    partly[:10] = math.nan  # NaN where the original has NaN, the rest compared
    (check,) = compare(partly, partly.clone(), Contract.tolerance(1e-2), reference=reference)
    assert check.ok


def test_exact_contract_demands_bit_identity_even_when_closer_to_the_reference():
    reference, eager = _outputs(0.01)
    (identical,) = compare(eager.clone(), eager, Contract.exact(), reference=reference)
    (closer,) = compare(reference.float(), eager, Contract.exact(), reference=reference)
    assert identical.ok and identical.verdict == "bit-identical" and identical.rel_err > 0
    assert not closer.ok


def test_quality_gate_measures_the_angle_against_the_reference():
    """FP8's gate (cos >= 0.999, 25 dB) on a model whose eager output is itself 0.045 off (cos 0.999):
    an FP8 output adding 0.03 of error passes; one adding 0.1 fails; both report both numbers."""
    gate = QualityGate()
    reference, eager = _outputs(0.045)
    fine = _moved(reference, math.hypot(0.045, 0.03), 11)
    poor = _moved(reference, math.hypot(0.045, 0.1), 12)
    assert judge(fine, eager, reference, gate).passed
    verdict = judge(poor, eager, reference, gate)
    assert not verdict.passed
    assert verdict.candidate.cosine < verdict.eager.cosine and verdict.vs_eager.rel_err > 0.09
    assert "eager" in str(verdict) and "reference" in str(verdict)


def test_without_a_reference_the_contract_is_judged_against_eager():
    _reference, eager = _outputs(0.01)
    (check,) = compare(_moved(eager.double(), 0.005, 2), eager, Contract.tolerance(1e-2))
    assert check.ok and "no higher-precision reference" in check.verdict and check.eager_rel_err is None


def test_lowering_rule_allows_half_again_the_op_by_op_error_plus_an_ulp():
    reference, op_by_op = _outputs(0.004)
    (same,) = compare(_moved(reference, 0.005, 5), op_by_op, LoweringRule(), reference=reference)
    (drifted,) = compare(_moved(reference, 0.02, 6), op_by_op, LoweringRule(), reference=reference)
    assert same.ok and not drifted.ok and "op by op" in drifted.verdict


def _upcast_scaled_products(graph_module: torch.fx.GraphModule, ctx: kopt.PassContext) -> None:
    """A pass that removes FLUX.1's precision hazard: ``bf16 * 1000`` computed in float32."""
    from kopt.fx.precision_hazards import find_precision_hazards

    nodes = {n.name: n for n in graph_module.graph.nodes}
    for hazard in find_precision_hazards(graph_module):
        node = nodes[hazard.node]
        if ctx.fire("upcast-scaled-product", node):
            with graph_module.graph.inserting_before(node):
                wide = graph_module.graph.call_function(aten._to_copy.default, (node.args[0],),
                                                        {"dtype": torch.float32})
            node.args = (wide, *node.args[1:])


def test_verify_accepts_a_rewrite_that_moves_flux1_toward_the_reference():
    """A rewrite closer to the reference than eager passes ``verify=True`` with a tight contract (1e-3)
    although it is 0.026 from eager; the report shows both numbers."""
    model, inputs = tiny_flux1.model_and_inputs(torch.bfloat16, guidance=3.5)
    upcast = kopt.FunctionPass("upcast-scaled-products", "test: bf16 x 1000 in float32",
                               Contract.tolerance(1e-3), _upcast_scaled_products)
    compiled = kopt.compile(model, passes=[upcast], lower="eager", verify=True, strict=True)
    with torch.no_grad():
        output, eager = compiled(**inputs)[0], model(**inputs)[0]
    graph = compiled.kopt_report.graphs[0]
    assert compiled.kopt_report.matches("upcast-scaled-products") == 2  # timestep and guidance
    assert graph.fallback is None
    (check,) = graph.verification
    assert check["ok"] and check["rel_err"] < check["eager_rel_err"] / 3
    assert check["rel_err_vs_eager"] > 1e-2 and relative_error(output, eager) > 1e-2
    assert "more accurate than eager" in str(compiled.kopt_report)


def test_distances_taken_in_chunks_equal_the_whole_tensor_float64_formulas(monkeypatch):
    """kopt.verify.distance sums squares chunk by chunk on the tensors' device; with chunks far smaller
    than the tensor the numbers are the float64 formulas' on the whole tensor."""
    import kopt.verify as verify

    monkeypatch.setattr(verify, "CHUNK", 1000)
    generator = torch.Generator().manual_seed(3)
    reference = torch.randn(4099, 3, generator=generator)
    candidate = (reference + 0.01 * torch.randn(4099, 3, generator=generator)).bfloat16()
    r, c = reference.double().flatten(), candidate.double().flatten()
    measured = verify.distance(candidate, reference)
    assert math.isclose(measured.rel_err, ((c - r).norm() / r.norm()).item(), rel_tol=1e-12)
    assert math.isclose(measured.cosine, (c @ r / (c.norm() * r.norm())).item(), rel_tol=1e-12)
    z = torch.randn(5000, dtype=torch.complex64, generator=generator)
    assert verify.distance(z, z).rel_err == 0.0 and math.isclose(verify.distance(z, z).cosine, 1.0)
    zeros = torch.zeros(10)
    assert verify.distance(zeros, zeros) == verify.Distance(0.0, 1.0)
    assert verify.distance(torch.ones(10), zeros).rel_err == math.inf
