"""The verifier's rules one at a time, without a child process: value comparison, trial plans,
edge-value profiles, and the static checks."""

from __future__ import annotations

import torch

from kopt.agent import region as regions
from kopt.agent.candidate import Candidate, CandidateKind, original_candidate
from kopt.agent.verify import VerifyConfig, static_checks
from kopt.agent.verify.compare import compare
from kopt.agent.verify.plan import free_symbols, plan_trials
from kopt.agent.verify.reference import reference, trial_inputs
from kopt.agent.verify.values import Profile, values
from kopt.passes.base import Contract

TOL = Contract.tolerance(1e-5)


def _softmax_region():
    return regions.from_function(lambda x: torch.softmax(x, -1), torch.randn(16, 40))


def _reference(region, profile=Profile.NORMAL, seed=0):
    from kopt.agent.verify.plan import TrialPlan

    plan = TrialPlan((), (profile,) * len(region.inputs), seed)
    inputs = trial_inputs(region, plan)
    return inputs, reference(region, plan, inputs)


def test_zeros_identity_and_partial_rows_fail_while_reordering_passes():
    """Relative error against float64 makes zeros cost 1; a wrong last row, averaged away by a norm under
    a loose contract, is caught by the per-row bound; a different summation order passes."""
    region = _softmax_region()
    (x,), ref = _reference(region)
    native, exact = ref.native[0], ref.exact[0]
    assert not compare(torch.zeros_like(native), native, exact, TOL).ok
    assert not compare(x.clone(), native, exact, TOL).ok
    loose = Contract.quality(min_cosine=0.9, rel_tol=0.2)
    last_row_wrong = native.clone()
    last_row_wrong[-1] = last_row_wrong[-1].flip(-1)
    partial = compare(last_row_wrong, native, exact, loose)
    assert partial.rel_err < 0.2 and not partial.ok and "row 15" in partial.detail
    reordered = torch.exp(x - x.amax(-1, keepdim=True)).flip(-1).cumsum(-1)[:, -1:]
    honest = torch.exp(x - x.amax(-1, keepdim=True)) / reordered
    assert compare(honest, native, exact, TOL).ok


def test_a_missed_tail_column_fails_element_by_element_under_a_quality_contract():
    """One column of 400 never written: 5% relative error passes an FP8-like 10% contract as a norm and
    per row, but its larger elements exceed their own bounds."""
    region = regions.from_function(lambda x: x * 2.0, torch.randn(16, 400))
    _, ref = _reference(region, seed=1)
    native, exact = ref.native[0], ref.exact[0]
    tail_missing = native.clone()
    tail_missing[:, -1] = 0.0
    tail = compare(tail_missing, native, exact, Contract.quality(min_cosine=0.99, rel_tol=0.1))
    assert tail.rel_err < 0.1 and not tail.ok and "per-element" in tail.detail


def test_precision_downgrade_fails_against_float64_but_upgrade_passes():
    """fp16 arithmetic under a float32 contract fails (large values overflow); float64 arithmetic, more
    accurate than the original, passes although it differs from it."""
    region = _softmax_region()
    (x,), ref = _reference(region, Profile.LARGE)
    half = torch.softmax(x.half(), -1).float()
    assert not compare(half, ref.native[0], ref.exact[0], Contract.tolerance(1e-3)).ok
    better = torch.softmax(x.double(), -1).float()
    assert compare(better, ref.native[0], ref.exact[0], TOL).ok


def test_nan_masking_and_invented_nans_are_caught():
    """Finite values where the original is NaN fail, and so do NaNs where it is finite."""
    region = _softmax_region()
    _, ref = _reference(region, Profile.NONFINITE, seed=3)
    native, exact = ref.native[0], ref.exact[0]
    assert torch.isnan(native).any()
    assert "masking" in compare(torch.nan_to_num(native), native, exact, TOL).detail
    invented = native.clone()
    invented[torch.isfinite(native).nonzero()[0].tolist()] = float("nan")
    assert "where the original is finite" in compare(invented, native, exact, TOL).detail


def test_profiles_make_what_they_promise():
    """large overflows float16, small underflows it, halfway values are exact rounding ties, nonfinite has
    NaN and inf."""
    generator = torch.Generator().manual_seed(0)
    large = values((4096,), torch.float32, Profile.LARGE, generator)
    assert torch.isinf(large.half()).any()
    small = values((4096,), torch.float32, Profile.SMALL, generator)
    assert (small.abs() < 6.1e-5).all()  # below float16's smallest normal
    ties = values((4096,), torch.float32, Profile.HALFWAY, generator)
    assert (ties.bfloat16().float() != ties).all()
    special = values((4096,), torch.float32, Profile.NONFINITE, generator)
    assert torch.isnan(special).any() and torch.isinf(special).any()


def test_plans_cover_every_profile_and_awkward_sizes():
    """One trial per profile at the region's own shapes, then hypothesis sizes within the element budget."""
    region = _softmax_region()
    config = VerifyConfig(shape_trials=6, max_elements=4096, seed=7)
    plans, _ = plan_trials(region, shape_specialized=False, config=config)
    assert {p.profiles[0] for p in plans if not p.resize} == set(Profile)
    resized = [dict(p.resize) for p in plans if p.resize]
    assert len(resized) >= 4
    assert all(r.get(0, 16) * r.get(1, 40) <= 4096 for r in resized)
    fixed, _ = plan_trials(region, shape_specialized=True, config=config)
    assert all(not p.resize for p in fixed)


def test_every_free_size_gets_a_trial_past_its_own_value_whatever_hypothesis_draws():
    """A candidate hard-coding the example's width (``x[:, :80]``) passes every trial at or below 80: each
    free size gets a trial above its own, the other sizes shrunk to fit the element budget."""
    region = regions.from_function(lambda x: torch.softmax(x, -1), torch.randn(300, 80))
    for seed in range(5):
        config = VerifyConfig(shape_trials=6, max_elements=4096, seed=seed)
        plans, _ = plan_trials(region, shape_specialized=False, config=config)
        resized = [dict(p.resize) for p in plans if p.resize]
        assert any(r.get(1, 80) > 80 for r in resized) and any(r.get(0, 300) > 300 for r in resized)
        assert all(r.get(0, 300) * r.get(1, 80) <= 4096 for r in resized)


def test_a_region_with_a_literal_split_keeps_its_own_shapes():
    """split(x, 16) of a width 32 means halves or 16 columns, a guess at any other width: no resizing."""
    def halves(x):
        a, b = x.chunk(2, dim=-1)
        return a * b

    region = regions.from_function(halves, torch.randn(4, 32))
    free, note = free_symbols(region)
    assert free == () and "size 16" in note
    flat = regions.from_function(lambda x: x.reshape(x.shape[0] * x.shape[1], -1) * 2, torch.randn(3, 5, 7))
    assert free_symbols(flat) == ((0, 1, 2), "")


def test_static_checks():
    """A candidate for another region, one that does not parse, or one without its entry point never runs."""
    region = _softmax_region()
    other = regions.from_function(lambda x: torch.softmax(x, -1), torch.randn(16, 41))
    good = original_candidate(region, TOL)
    assert static_checks(region, good)[0].passed
    assert "not" in static_checks(other, good)[0].detail
    broken = Candidate(region.signature, CandidateKind.TRITON_KERNEL, "def candidate(x:\n", TOL)
    assert "does not parse" in static_checks(region, broken)[0].detail
    missing = Candidate(region.signature, CandidateKind.TRITON_KERNEL, "def other(x):\n    return x\n", TOL)
    assert "candidate" in static_checks(region, missing)[0].detail


def test_candidate_hash_and_round_trip():
    """A candidate's content hash names its content; to_dict/from_dict round-trips it."""
    region = _softmax_region()
    candidate = original_candidate(region, TOL)
    again = Candidate.from_dict(candidate.to_dict())
    assert again == candidate and again.content_hash == candidate.content_hash
    changed = Candidate.from_dict({**candidate.to_dict(), "why": "another reason"})
    assert changed.content_hash != candidate.content_hash
