"""The agent on the large linears between the blocks (``between_blocks="linears"``): an LM head is a
graph of its own in the regional capture, gets FP8 choices of its own, and a side of the A/B applies
such a choice to the head alone, the blocks staying in bf16; the model's output is checked as for
every choice."""

from __future__ import annotations

import torch

from kopt.agent.graphs import capture_graphs
from kopt.agent.propose.pipeline import propose_pipelines
from kopt.agent.regional_clock import RegionalClock
from kopt.fp8 import Fp8Config
from tests.test_regional_between_blocks import tiny_lm


def test_the_lm_head_gets_an_fp8_choice_of_its_own_that_leaves_the_blocks_alone():
    model = tiny_lm()
    x = torch.randn(2, 8, 64)
    graphs = capture_graphs(model, (x,), regional=True, between_blocks="linears")
    assert [g.calls for g in graphs] == [2, 1]  # the block class (two blocks), then the head
    head = graphs[1]
    gemms = [n for n in head.original.graph.nodes if n.op == "call_function" and "mm" in str(n.target)]
    assert len(gemms) == 1  # the head's one GEMM
    choices = [c for c in propose_pipelines(graphs, fp8=Fp8Config(min_features=16))
               if c.region_signature == head.signature and dict(c.params)["change"] == "fp8 row scales"]
    assert len(choices) == 1
    clock = RegionalClock(model, (x,), lower="eager", between_blocks="linears")
    try:
        chosen = {head.signature: choices[0]}
        report = clock.report(chosen)
        matched = [any(r.name == "fp8-linear" and r.matches for r in g.passes) for g in report.graphs]
        assert matched == [False, True]  # the head in FP8, the blocks as they were
        checks = clock.model_checks(chosen, choices[0].contract, seed=3)
        assert checks and all(0 < c["rel_err"] < 0.1 for c in checks)  # quantized, FP8-sized against fp32
        assert all(c["ok"] for c in checks), checks
        assert len(clock.samples(chosen, 2, 0)) == 2 and len(clock.samples({}, 2, 1)) == 2
    finally:
        clock.close()
    assert all(getattr(m, "_compiled_call_impl", None) is None for m in (*model.layers, model.head))


def test_a_lone_gemm_under_the_bar_of_the_work_gets_no_choices():
    """Amdahl on FLOPs: the head is about 8.5 % of this model's work (two blocks of 1024 -> 4096 -> 1024
    against one 1024 -> 1536 GEMM), kept at a 1 % bar, dropped at 10 %; a block graph is never dropped."""
    from kopt.agent.graphs import without_minor_gemms

    model = tiny_lm()
    graphs = capture_graphs(model, (torch.randn(2, 8, 64),), regional=True, between_blocks="linears")
    assert [g.calls for g in without_minor_gemms(graphs, 0.01)] == [2, 1]
    assert [g.calls for g in without_minor_gemms(graphs, 0.10)] == [2]
    assert [g.calls for g in without_minor_gemms(graphs, 0.99)] == [2]


def test_optimize_with_fp8_makes_the_lm_head_a_graph_by_default(tmp_path):
    import pytest

    from kopt.agent import optimize

    model = tiny_lm()
    x = torch.randn(2, 8, 64)
    result = optimize(model, (x,), budget_min=1, kb_path=tmp_path / "kb.sqlite", regional=True, clock="cost-model",
                      fp8=Fp8Config(min_features=16), max_candidates=1, progress=False, workers=1)
    assert [g.calls for g in result.graphs] == [2, 1]
    bf16 = optimize(model, (x,), budget_min=1, kb_path=tmp_path / "kb.sqlite", regional=True, clock="cost-model",
                    max_candidates=1, progress=False, workers=1)
    assert [g.calls for g in bf16.graphs] == [2]  # without FP8 a lone linear has nothing to gain
    with pytest.raises(ValueError, match="is for regional runs"):
        optimize(model, (x,), budget_min=1, kb_path=tmp_path / "kb.sqlite", regional=False, clock="cost-model",
                 between_blocks="linears", max_candidates=1, progress=False, workers=1)


def test_an_accepted_lm_head_choice_applies_with_between_blocks_linears(tmp_path):
    """The user's path: the knowledge base holds an accepted FP8 choice for the head's graph;
    ``kopt.compile(passes="auto", regional=True, between_blocks="linears")`` finds it by the graph's
    signature, verifies it again and quantizes the head alone; without ``between_blocks`` the head
    is no graph and nothing applies to it."""
    import kopt
    from kopt.agent.kb import KnowledgeBase, Status
    from kopt.agent.pipeline_choice import graph_region
    from kopt.reference import reference_forward
    from tests.conftest import rel_err

    model = tiny_lm()
    x = torch.randn(2, 8, 64)
    graphs = capture_graphs(model, (x,), regional=True, between_blocks="linears")
    head = graphs[1]
    choice = next(c for c in propose_pipelines(graphs, fp8=Fp8Config(min_features=16))
                  if c.region_signature == head.signature and dict(c.params)["change"] == "fp8 row scales")
    kb_path = tmp_path / "kb.sqlite"
    with KnowledgeBase(kb_path) as kb:
        kb.record_region(graph_region(head.original))
        kb.record_candidate(choice, status=Status.ACCEPTED, reason="won on the GPU")
    fresh = torch.randn(2, 8, 64)
    with torch.no_grad():
        compiled = kopt.compile(model, passes="auto", regional=True, between_blocks="linears", lower="eager",
                                kb=kb_path, check_lowering=False, progress=False)
        got = compiled(fresh)
        report = compiled.kopt_report
        compiled.undo()
        plain = kopt.compile(model, passes="auto", regional=True, lower="eager", kb=kb_path,
                             check_lowering=False, progress=False)
        plain_report = plain.kopt_report
        plain(fresh)
        plain.undo()
    fp8 = [any(r.name == "fp8-linear" and r.matches for r in g.passes) for g in report.graphs]
    assert fp8 == [False, True]  # the head alone, as the KB says
    assert 0 < rel_err(got, reference_forward(model, fresh)) < 0.1
    assert not any(r.name == "fp8-linear" and r.matches for g in plain_report.graphs for r in g.passes)


def test_when_no_linear_between_blocks_is_worth_it_the_sides_compile_none(tmp_path):
    """At a 10 % bar the head (8.5 % of the work) gets no choices, and the A/B sides then compile the
    blocks alone, as without FP8 (a lone linear compiled for nothing costs a compile per side)."""
    from kopt.agent import optimize
    from kopt.agent.bench import BenchConfig

    model = tiny_lm()
    x = torch.randn(2, 8, 64)
    result = optimize(model, (x,), budget_min=1, kb_path=tmp_path / "kb.sqlite", regional=True, lower="eager",
                      fp8=Fp8Config(min_features=16), bench_config=BenchConfig(min_gain=0.10), max_candidates=1,
                      micro=False, progress=False, workers=1)
    assert [g.calls for g in result.graphs] == [2] and result.clock.between_blocks == "eager"


def test_a_model_whose_blocks_an_inner_module_runs_gets_the_outer_graph_by_default():
    """An LLM (its layers run by an inner module, the LM head and logit cap after it) is run with the
    code around that module compiled as a graph of its own; a model that runs its blocks itself keeps
    the earlier default (the head a graph of its own with FP8, else the code eager)."""
    from kopt.agent.loop import default_between_blocks
    from tests.test_between_blocks_outer import _CappedLM

    capped = _CappedLM().eval()
    assert default_between_blocks(capped, regional=True, fp8=False) == "outer"
    assert default_between_blocks(capped, regional=True, fp8=True) == "outer"
    assert default_between_blocks(capped, regional=False, fp8=False) == "eager"
    flat = tiny_lm()
    assert default_between_blocks(flat, regional=True, fp8=True) == "linears"
    assert default_between_blocks(flat, regional=True, fp8=False) == "eager"


def test_optimize_on_an_llm_captures_the_head_and_cap_as_a_graph_by_default(tmp_path):
    from kopt.agent import optimize
    from tests.test_between_blocks_outer import _CappedLM

    torch.manual_seed(0)
    model = _CappedLM().eval().requires_grad_(False)
    ids = torch.randint(0, 1536, (1, 8))
    result = optimize(model, (ids,), budget_min=1, kb_path=tmp_path / "kb.sqlite", regional=True, clock="cost-model",
                      max_candidates=1, progress=False, workers=1)
    assert [g.calls for g in result.graphs] == [2, 1]  # the block class, then the head with its cap
    ops = {str(n.target) for n in result.graphs[1].original.graph.nodes if n.op == "call_function"}
    assert any("tanh" in op for op in ops) and any("mm" in op for op in ops)
