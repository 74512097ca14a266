"""The agent's loop end to end on the CPU: profile, propose, verify in the sandbox, judge end to end
(deterministic cost model), store in a real SQLite knowledge base, resume, apply through kopt.compile."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import kopt
from kopt.agent import optimize
from kopt.agent.candidate import Candidate, CandidateKind
from kopt.agent.graphs import capture_graphs
from kopt.agent.kb import KnowledgeBase, Status
from kopt.agent.profile import find_occurrences, profile_graphs
from kopt.agent.propose.llm import LLMProposer
from kopt.passes.base import Contract
from kopt.reference import reference_forward
from tests.agent.tiny_models import sigmoid_gelu_mlp

RECORDINGS = Path(__file__).parent / "llm_recordings"
ROOT = Path(__file__).resolve().parents[2]


def _rel_err(got: torch.Tensor, reference: torch.Tensor) -> float:
    return float((got.double() - reference).norm() / reference.norm())


def test_profile_attributes_time_and_floor_to_regions():
    """Every region gets profiled time and a positive floor; the ranking is by headroom."""
    model, inputs = sigmoid_gelu_mlp()
    graphs = capture_graphs(model, inputs)
    occurrences = find_occurrences(graphs[0].graph_module)
    profile = profile_graphs(graphs, occurrences)
    assert len(profile.regions) == 1 and profile.regions[0].seconds > 0
    assert profile.regions[0].floor.bytes == 2 * 2 * 24 * 64 * 4  # one fp32 read + one write
    assert profile.ceilings.source == "measured-cpu"


def test_loop_accepts_rejects_stores_and_resumes(tmp_path):
    """One accepted and at least one rejected candidate (with its reason) land in the SQLite KB; a
    second run skips every candidate already evaluated and starts from the accepted one. Kernels alone,
    each timed end to end (no pipeline choices, no micro step: their tests are in test_pipeline_choice)."""
    model, inputs = sigmoid_gelu_mlp()
    kb_path = tmp_path / "kb.sqlite"
    kernels_only = dict(clock="cost-model", seed=0, model_name="mlp", pipelines=False, micro=False)
    first = optimize(model, inputs, budget_min=5, kb_path=kb_path, **kernels_only)
    statuses = [e.status for e in first.evaluations]
    assert Status.ACCEPTED in statuses and Status.SLOWER in statuses
    rejected = next(e for e in first.evaluations if e.status is Status.SLOWER and e.e2e is not None)
    assert "no end-to-end win" in rejected.reason and rejected.e2e.speedup.samples == 20
    accepted = next(e for e in first.evaluations if e.status is Status.ACCEPTED)
    assert accepted.e2e.speedup.ci_low > 1.0 and accepted.verdict.accepted
    assert all(q["ok"] for q in accepted.e2e.quality)
    with KnowledgeBase(kb_path) as kb:
        records = kb.candidates()
        assert len(records) == len(first.evaluations)
        assert {r.status for r in records} >= {Status.ACCEPTED, Status.SLOWER}
        assert all(r.verification is not None for r in records)
        assert len(kb.lessons()) == len(records)
    assert kb_path.read_bytes()[:16] == b"SQLite format 3\x00"
    plot = first.plot(tmp_path / "regions.png")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "accepted" in first.table() and "slower" in first.table()
    assert all(e.seconds > 0 for e in first.evaluations)  # each evaluation's wall time, in the table
    timed = [e for e in first.evaluations if e.e2e is not None]
    assert f"{len(timed)} timed end to end in {sum(e.seconds for e in timed):.0f} s" in first.table()

    second = optimize(model, inputs, budget_min=5, kb_path=kb_path, **kernels_only)
    assert second.evaluations == [] and second.skipped == len(first.evaluations)
    assert accepted.candidate.region_signature in second.resumed


def test_compile_applies_kb_win_and_reverifies(tmp_path):
    """kopt.compile(passes="auto", kb=...) replaces the region by the KB's accepted candidate after
    verifying it again; a stored 'accepted' candidate that is wrong fails re-verification and is not applied."""
    model, inputs = sigmoid_gelu_mlp()
    kb_path = tmp_path / "kb.sqlite"
    optimize(model, inputs, budget_min=5, kb_path=kb_path, clock="cost-model", max_candidates=1, pipelines=False)
    fresh = torch.randn(2, 24, 32)
    compiled = kopt.compile(model, passes="auto", lower="eager", kb=kb_path, check_lowering=False)
    out = compiled(fresh)
    notes = [n for record in compiled.kopt_report.graphs[-1].passes if record.name == "kb-apply" for n in record.notes]
    assert any("re-verified" in n for n in notes) and any("1 region occurrence(s) replaced" in n for n in notes)
    assert _rel_err(out, reference_forward(model, fresh)) < 1e-5

    region = find_occurrences(capture_graphs(model, inputs)[0].graph_module)[0].region
    zeros = Candidate(region.signature, CandidateKind.TRITON_KERNEL, "import torch\n\n\ndef candidate(in0):\n"
                      "    return (torch.zeros_like(in0),)\n", Contract.tolerance(1e-2), origin="test")
    bad_kb = tmp_path / "bad.sqlite"
    with KnowledgeBase(bad_kb) as kb:
        kb.record_region(region)
        kb.record_candidate(zeros, status=Status.ACCEPTED, reason="planted: accepted by an older verifier")
    compiled = kopt.compile(model, passes="auto", lower="eager", kb=bad_kb, check_lowering=False)
    out = compiled(fresh)
    record = next(r for r in compiled.kopt_report.graphs[-1].passes if r.name == "kb-apply")
    assert any("failed re-verification" in m.reason for m in record.near_misses)
    assert _rel_err(out, reference_forward(model, fresh)) < 1e-5
    with KnowledgeBase(bad_kb) as kb:
        assert kb.latest()[-1].status is Status.REJECTED and kb.accepted(region.signature) == []


def test_llm_replay_turns_a_recorded_proposal_into_an_accepted_kernel(tmp_path):
    """The hand-authored fixture (labelled so in its provenance) replays through the LLM proposer: its
    Triton kernel passes the real verifier and is accepted end to end."""
    fixture = json.loads((RECORDINGS / "sigmoid_gelu_fixture.json").read_text())
    assert fixture["provenance"].startswith("HAND-AUTHORED TEST FIXTURE")
    model, inputs = sigmoid_gelu_mlp()
    result = optimize(model, inputs, budget_min=5, proposer="llm", kb_path=tmp_path / "kb.sqlite",
                      clock="cost-model", llm=LLMProposer(replay=RECORDINGS))
    assert len(result.evaluations) == 1
    evaluation = result.evaluations[0]
    assert evaluation.candidate.origin.startswith("llm:") and evaluation.candidate.kind is CandidateKind.TRITON_KERNEL
    assert evaluation.verdict.accepted and evaluation.status is Status.ACCEPTED, evaluation.reason


def test_cli_optimize_runs_end_to_end(tmp_path):
    """`kopt optimize flux2` in a subprocess: tiny FLUX.2, two candidates, a KB, a table, a PNG, JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)  # the command sets it itself on a machine without a GPU
    out = subprocess.run([sys.executable, "-m", "kopt.cli", "optimize", "flux2", "--budget-min", "3", "--kb",
                          str(tmp_path / "kb.sqlite"), "--cost-model", "--max-candidates", "2", "--plot",
                          str(tmp_path / "p.png"), "--json", str(tmp_path / "o.json"), "--no-progress"],
                         capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2 evaluated" in out.stdout
    data = json.loads((tmp_path / "o.json").read_text())
    assert len(data["evaluations"]) == 2 and data["clock"] == "cost-model"
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    with KnowledgeBase(tmp_path / "kb.sqlite") as kb:
        assert kb.counts()["candidates"] == 2


def test_a_candidate_whose_evaluation_raises_is_an_error_and_the_run_goes_on(tmp_path, monkeypatch):
    """An exception while evaluating one candidate is that candidate's ERROR record (with the exception
    as its reason); the next candidates are still evaluated and one is still accepted."""
    import kopt.agent.loop as loop

    real, raised = loop.evaluate, []

    def first_one_raises(candidate, *args, **kwargs):
        if not raised:
            raised.append(candidate)
            raise RuntimeError("Unhandled FakeTensor Device Propagation for aten.add.Tensor")
        return real(candidate, *args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", first_one_raises)
    model, inputs = sigmoid_gelu_mlp()
    result = optimize(model, inputs, budget_min=5, kb_path=tmp_path / "kb.sqlite", clock="cost-model", seed=0,
                      model_name="mlp", pipelines=False, micro=False)
    first = result.evaluations[0]
    assert first.candidate is raised[0] and first.status is Status.ERROR
    assert first.reason == ("the evaluation raised RuntimeError: "
                            "Unhandled FakeTensor Device Propagation for aten.add.Tensor")
    assert len(result.evaluations) > 1 and Status.ACCEPTED in [e.status for e in result.evaluations[1:]]
    with KnowledgeBase(tmp_path / "kb.sqlite") as kb:
        assert Status.ERROR in {r.status for r in kb.candidates()}
