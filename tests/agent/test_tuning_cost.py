"""GEMM tuning that would outlast the budget is not started: the expected cost counts the graph's
distinct GEMM shapes; the loop lists such a choice as deferred and evaluates the rest; the benchmark
script writes each evaluation as it comes. CPU, deterministic cost model."""

from __future__ import annotations

import json

import kopt.agent.loop as loop
from benchmarks.agent_run import partial_writer
from kopt.agent import optimize
from kopt.agent.candidate import CandidateKind
from kopt.agent.graphs import capture_graphs
from kopt.agent.pipeline_choice import to_candidate
from kopt.agent.propose.pipeline import LOWERING_TUNING, base_pipeline, lowering_choices
from kopt.agent.tuning_cost import SECONDS_PER_FP8_GEMM_SHAPE, SECONDS_PER_GEMM_SHAPE, gemm_shapes, tuning_seconds
from tests.agent.tiny_models import sigmoid_gelu_mlp


def test_the_expected_tuning_time_counts_distinct_gemm_shapes():
    model, inputs = sigmoid_gelu_mlp()
    graphs = capture_graphs(model, inputs)
    shapes = gemm_shapes(graphs[0].graph_module)
    assert len(shapes) == 2  # the MLP's two linears, of different shapes
    tune_gemms, tune_kernels = (to_candidate(graphs[0].signature, c) for c in lowering_choices(base_pipeline(), "cuda"))
    assert LOWERING_TUNING[0][1] == dict(tune_gemms.params)["change"]
    assert tuning_seconds(tune_gemms, graphs) == 2 * SECONDS_PER_GEMM_SHAPE
    assert tuning_seconds(tune_kernels, graphs) == 0.0
    assert tuning_seconds(tune_gemms, []) == 0.0  # not a graph of this run: nothing to estimate


def test_fp8_gemms_are_expected_to_tune_longer_than_bf16_ones():
    """An FP8 scaled_mm shape weighs five times the choices of a bf16 mm (49-98 s against 6-7 s each on
    an H200): the same tuning on top of an FP8 pass list is expected to take that much longer."""
    import dataclasses

    from kopt.agent.pipeline_choice import from_candidate

    model, inputs = sigmoid_gelu_mlp()
    graphs = capture_graphs(model, inputs)
    tune_gemms = to_candidate(graphs[0].signature, lowering_choices(base_pipeline(), "cuda")[0])
    choice = from_candidate(tune_gemms)
    on_fp8 = to_candidate(graphs[0].signature, dataclasses.replace(choice, passes=(*choice.passes, "fp8-linear")))
    assert tuning_seconds(on_fp8, graphs) == 2 * SECONDS_PER_FP8_GEMM_SHAPE
    assert SECONDS_PER_FP8_GEMM_SHAPE > 5 * SECONDS_PER_GEMM_SHAPE


def test_a_choice_whose_tuning_outlasts_the_budget_is_deferred_and_the_rest_run(tmp_path, monkeypatch):
    """With every pipeline choice expected to tune for an hour, none starts: each is listed as deferred,
    recorded nowhere (a run with more time tries it), and the region candidates are still evaluated."""
    hour = 3600.0
    monkeypatch.setattr(loop, "tuning_seconds",
                        lambda c, graphs: hour if c.kind is CandidateKind.PASS_CHOICE else 0.0)
    model, inputs = sigmoid_gelu_mlp()
    seen = []
    result = optimize(model, inputs, budget_min=5, kb_path=tmp_path / "kb.sqlite", clock="cost-model", seed=0,
                      model_name="mlp", on_evaluation=seen.append)
    assert result.deferred and all(c.kind is CandidateKind.PASS_CHOICE for c in result.deferred)
    assert result.evaluations and all(e.candidate.kind is not CandidateKind.PASS_CHOICE for e in result.evaluations)
    assert seen == result.evaluations  # the callback saw each evaluation, in order
    assert "not started, longer than the time left (GEMM tuning" in result.table()

    path = tmp_path / "agent_mlp.json"
    write = partial_writer(path, {"workload": "mlp"})
    for evaluation in result.evaluations[:2]:
        write(evaluation)
    written = json.loads(path.read_text())
    assert written["finished"] is False and written["workload"] == "mlp"
    assert [e["candidate"] for e in written["evaluations"]] == [e.candidate.content_hash
                                                                 for e in result.evaluations[:2]]
