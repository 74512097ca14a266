"""Pipeline choices that change how Inductor lowers a graph (its GEMMs autotuned, its generated kernels'
launch configs tuned): proposed on a GPU only, stored and composed like any choice, judged as lowered,
and applied by ``kopt.compile(passes="auto")`` to their graph alone."""

import json

import torch

import kopt
from kopt.agent.candidate import Candidate, CandidateKind
from kopt.agent.graphs import capture_graphs
from kopt.agent.kb import KnowledgeBase, Status
from kopt.agent.kb.records import Measurement
from kopt.agent.pipeline_choice import (
    LOWERING_CONTRACT,
    PipelineChoice,
    from_candidate,
    graph_region,
    lowered_output_checks,
    random_args,
    run_choice,
    to_candidate,
)
from kopt.agent.propose.pipeline import base_pipeline, lowering_choices, pass_choices, propose_pipelines
from tests.agent.tiny_models import sigmoid_gelu_mlp


def test_lowering_tunings_are_proposed_on_a_gpu_only_with_the_base_passes():
    base = base_pipeline()
    assert lowering_choices(base, "cpu") == []
    choices = lowering_choices(base, "cuda:0")
    assert [c.inductor_patches for c in choices] == [{"max_autotune_gemm": True}, {"coordinate_descent_tuning": True}]
    assert all(c.passes == base == c.base for c in choices)
    model, inputs = sigmoid_gelu_mlp()
    graphs = capture_graphs(model, inputs)
    on_gpu = [from_candidate(c) for c in propose_pipelines(graphs, device="cuda:0")]
    on_cpu = [from_candidate(c) for c in propose_pipelines(graphs, device="cpu")]
    assert sum(bool(c.inductor) for c in on_gpu) == 2 and not any(c.inductor for c in on_cpu)


def test_a_lowering_choice_round_trips_composes_and_widens_the_contract():
    base = base_pipeline()
    tune, drop = lowering_choices(base, "cuda:0")[0], {c.change: c for c in pass_choices(base)}["drop bias-absorption"]
    assert PipelineChoice.from_dict(json.loads(json.dumps(tune.to_dict()))) == tune
    assert "inductor" not in drop.to_dict()  # choices without patches keep the content hash they had
    both = tune.applied_to(drop)
    assert both.inductor == tune.inductor and "bias-absorption" not in both.passes
    assert both.on_top_of == "drop bias-absorption"
    assert tune.contract.rel_tol == PipelineChoice(base, base).contract.combine(LOWERING_CONTRACT).rel_tol
    assert tune.contract.rel_tol > PipelineChoice(base, base).contract.rel_tol


def test_the_lowered_graph_is_what_is_judged():
    """The choice changes no FX node, so its graph is lowered with its patches and that lowering's
    outputs on fresh inputs are checked against the float64 reference of the graph before passes."""
    model, inputs = sigmoid_gelu_mlp()
    graph = capture_graphs(model, inputs)[0]
    choice = lowering_choices(base_pipeline(), "cuda:0")[1]
    rewritten = run_choice(graph.original, choice)
    checks = lowered_output_checks(graph.original, rewritten, random_args(graph.original, seed=5), choice.contract,
                                   choice.inductor_patches)
    assert checks and all(c["ok"] and c["lowered"] for c in checks)
    assert all(0 < c["rel_err"] < 1e-4 for c in checks)  # float32 model: the lowering's own rounding only


def test_kopt_compile_lowers_the_chosen_graph_with_the_kb_choice_patches(tmp_path):
    model, inputs = sigmoid_gelu_mlp()
    graph = capture_graphs(model, inputs)[0]
    choice = lowering_choices(base_pipeline(), "cuda:0")[1]
    kb_path = tmp_path / "kb.sqlite"
    with KnowledgeBase(kb_path) as kb:
        kb.record_region(graph_region(graph.original))
        kb.record_candidate(to_candidate(graph.signature, choice), status=Status.ACCEPTED,
                            reason="end-to-end win (planted for the test)",
                            e2e=Measurement("speedup", 1.03, 1.02, 1.04, 20))
    fresh = torch.randn(2, 24, 32)
    compiled = kopt.compile(model, passes="auto", lower="eager", kb=kb_path, check_lowering=False)
    plain = kopt.compile(model, passes="auto", lower="eager", kb=False, check_lowering=False)
    with torch.no_grad():
        assert torch.equal(compiled(fresh), plain(fresh))
    assert "for this graph: coordinate_descent_tuning=True" in compiled.kopt_report.graphs[-1].lowering
    assert "for this graph" not in plain.kopt_report.graphs[-1].lowering
    other = Candidate("0" * 64, CandidateKind.PASS_CHOICE, json.dumps(choice.to_dict()), choice.contract,
                      entry_point="pipeline")
    assert from_candidate(other).inductor_patches == {"coordinate_descent_tuning": True}


def test_a_lowering_choice_is_never_settled_as_changing_nothing():
    """Its graph is the baseline's, node for node, yet Inductor may lower it to other kernels: it is timed."""
    from kopt.agent.unchanged import changes_nothing

    model, inputs = sigmoid_gelu_mlp()
    graphs = capture_graphs(model, inputs)
    base = base_pipeline()
    tune = to_candidate(graphs[0].signature, lowering_choices(base, "cuda:0")[0])
    same = to_candidate(graphs[0].signature, PipelineChoice(base, base, change="nothing"))
    assert changes_nothing(graphs, {}, tune) == ""
    assert changes_nothing(graphs, {}, same).startswith("changes nothing")
    assert changes_nothing(graphs, {graphs[0].signature: tune}, tune).startswith("changes nothing")
