"""FP8 on one group of a graph's linears (:mod:`kopt.agent.fp8_groups`): groups found by the activation
they read, proposed per graph, applied as an include list, and tried only after FP8 on all of them
missed the model's output contract."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import kopt
from kopt.agent.candidate import Candidate
from kopt.agent.fp8_groups import (
    is_narrowed,
    linear_groups,
    narrowed,
    narrowed_after_whole,
    narrowing_unwanted,
)
from kopt.agent.graphs import capture_graphs
from kopt.agent.kb import KnowledgeBase, Status, current_environment
from kopt.agent.pipeline_choice import graph_region, to_candidate
from kopt.agent.propose.pipeline import base_pipeline, fp8_choices
from kopt.fp8.config import Fp8Config, QualityGate
from kopt.reference import reference_forward
from tests.agent.tiny_models import sigmoid_gelu_mlp, tiny_block_stack
from tests.conftest import rel_err

CONFIG = Fp8Config(min_features=16)
ROWS = 2 * 24  # tiny_block_stack's (2, 24, 32) input


def _block_graph():
    return capture_graphs(*tiny_block_stack(), regional=True)[0]


def _choices(graph) -> dict[str, Candidate]:
    return {c.change: to_candidate(graph.signature, c) for c in fp8_choices(base_pipeline(), CONFIG,
                                                                              graph.graph_module)}


def _model_check(ok: bool) -> dict:
    return {"kind": "whole-model", "accepted": ok,
            "checks": [{"graph": 0, "output": 0, "ok": True}, {"graph": "model", "output": 0, "ok": ok}]}


def test_the_groups_are_the_linears_reading_one_activation_largest_first():
    groups = linear_groups(_block_graph().graph_module, CONFIG)
    assert [set(g.paths) for g in groups] == [{"up.weight", "gate.weight"}, {"qkv.weight"}, {"down.weight"},
                                              {"out.weight"}]
    assert [g.flops for g in groups] == [2 * ROWS * 32 * 64 * 2, 2 * ROWS * 32 * 96, 2 * ROWS * 64 * 32,
                                         2 * ROWS * 32 * 32]
    assert linear_groups(_block_graph().graph_module, Fp8Config(min_features=64)) == []  # none is that wide


def test_each_group_is_proposed_after_the_whole_graph_choices_only_where_there_are_two():
    changes = list(_choices(_block_graph()))
    whole = [c for c in changes if " only" not in c]
    assert whole == ["fp8 tensor scales", "fp8 row scales", "fp8 block-1x128 scales", "fp8 block-128x128 scales",
                     "fp8 row scales + fp8 attention"]
    assert changes[len(whole):] == ["fp8 row scales on up.weight, gate.weight only",
                                    "fp8 row scales on qkv.weight only", "fp8 row scales on down.weight only",
                                    "fp8 row scales on out.weight only"]
    mlp = capture_graphs(*sigmoid_gelu_mlp())[0]
    assert len(linear_groups(mlp.graph_module, CONFIG)) == 2
    lone = torch.nn.Sequential(torch.nn.Linear(32, 32)).eval()
    graph = capture_graphs(lone, (torch.randn(4, 32),))[0]
    assert not any(" only" in c.change for c in fp8_choices(base_pipeline(), CONFIG, graph.graph_module))


def test_a_narrowed_choice_quantizes_its_group_alone_and_rounds_less_than_all_of_them():
    """The include list reaches the compile: one merged GEMM in FP8, the others declined by name; the
    output moves from the float32 reference, less than with every linear in FP8."""
    model, (x,) = tiny_block_stack()
    model = model.to(torch.bfloat16)
    x = torch.randn(x.shape, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    group = linear_groups(_block_graph().graph_module, CONFIG)[0]
    with torch.no_grad():
        exact = reference_forward(model, x)
        errors = {}
        for name, config in (("group", narrowed(CONFIG, group)), ("all", CONFIG)):
            compiled = kopt.compile(model, fp8=config, regional=True, lower="eager", progress=False)
            errors[name] = rel_err(compiled(x), exact)
            fired = [p for g in compiled.kopt_report.graphs for p in g.passes if p.name == "fp8-linear"]
            compiled.undo()
            assert sum(sum(p.matches.values()) for p in fired) == (1 if name == "group" else 4), name
    assert 0 < errors["group"] < errors["all"], errors


def test_a_narrowed_choice_waits_for_the_whole_graph_choice_at_its_granularity_to_miss(tmp_path):
    graph = _block_graph()
    found = _choices(graph)
    narrow, row, tensor, attention = (found[k] for k in ("fp8 row scales on down.weight only", "fp8 row scales",
                                                           "fp8 tensor scales", "fp8 row scales + fp8 attention"))
    assert is_narrowed(narrow) and not is_narrowed(row) and not is_narrowed(tensor)
    own = Fp8Config(min_features=16, include=("qkv.*", "down.*"))  # a user's own include patterns
    assert not any(is_narrowed(to_candidate(graph.signature, c)) for c in fp8_choices(base_pipeline(), own)
                   if " only" not in c.change)
    with KnowledgeBase(tmp_path / "kb.sqlite") as kb:
        environment = kb.record_environment(current_environment())
        kb.record_region(graph_region(graph.original))

        def latest():
            return kb.latest(signature=graph.signature, environment=environment)

        assert "has not missed" in narrowing_unwanted(narrow, latest())  # nothing judged yet
        kb.record_candidate(tensor, status=Status.SLOWER, reason="model output outside the contract",
                            verdict=_model_check(False), environment=environment)
        assert narrowing_unwanted(narrow, latest())  # another granularity's miss says nothing of row scales
        kb.record_candidate(attention, status=Status.SLOWER, reason="model output outside the contract",
                            verdict=_model_check(False), environment=environment)
        assert narrowing_unwanted(narrow, latest())  # nor does a miss with FP8 attention, which it leaves out
        kb.record_candidate(row, status=Status.ACCEPTED, reason="end-to-end win", verdict=_model_check(True),
                            environment=environment)
        assert narrowing_unwanted(narrow, latest())  # all of them met it: a part of them is not wanted
        kb.record_candidate(row, status=Status.SLOWER, reason="model output outside the contract",
                            verdict=_model_check(False), environment=environment)
        assert narrowing_unwanted(narrow, latest()) is None
        assert narrowing_unwanted(row, latest()) is None  # the rule is for narrowed choices only


def test_narrowed_choices_follow_the_last_whole_graph_choice_of_their_graph_in_their_order():
    found = list(_choices(_block_graph()).values())
    whole, narrow = [c for c in found if not is_narrowed(c)], [c for c in found if is_narrowed(c)]
    elsewhere = dataclasses.replace(narrow[0], region_signature="b" * 64)  # no whole-graph choice of its graph
    mixed = [narrow[1], narrow[0], whole[0], elsewhere, whole[1], narrow[2], whole[2], whole[3]]
    ordered = narrowed_after_whole(mixed)
    assert ordered == [whole[0], whole[1], whole[2], whole[3], narrow[1], narrow[0], narrow[2], elsewhere]


@pytest.mark.parametrize("gate_passes", [False, True])
def test_the_loop_evaluates_a_group_only_after_all_linears_in_fp8_missed(tmp_path, monkeypatch, gate_passes):
    """Through the real loop on the tiny block stack (CPU, FX lowering): with a gate no FP8 output can
    meet, FP8 on all linears misses and the largest group alone is evaluated next; with a gate every
    output meets, the whole-graph choice is judged and the group is not evaluated."""
    import kopt.agent.loop as loop
    from kopt.agent import optimize

    gate = QualityGate(min_cosine=0.9, min_sqnr_db=0.0) if gate_passes else QualityGate(min_cosine=1.0,
                                                                                       min_sqnr_db=1000.0)
    config = Fp8Config(min_features=16, gate=gate)
    model, inputs = tiny_block_stack()

    def batches(*args, graphs=(), **kwargs):
        found = {c.change: to_candidate(graphs[0].signature, c)
                 for c in fp8_choices(base_pipeline(), config, graphs[0].graph_module)}
        yield [found["fp8 row scales"], found["fp8 row scales on up.weight, gate.weight only"]]

    monkeypatch.setattr(loop, "_proposal_batches", lambda *a, **k: batches(graphs=a[6]))
    result = optimize(model, inputs, budget_min=10, kb_path=tmp_path / "kb.sqlite", regional=True, lower="eager",
                      micro=False, fp8=config, progress=False)
    changes = [dict(e.candidate.params)["change"] for e in result.evaluations]
    if gate_passes:
        assert changes == ["fp8 row scales"]
    else:
        assert changes == ["fp8 row scales", "fp8 row scales on up.weight, gate.weight only"]
        whole, group = result.evaluations
        assert "model output outside the contract" in whole.reason
        assert group.e2e is not None  # compiled, checked on the model's output and timed like any choice


def test_a_group_in_the_middle_layers_is_proposed_for_a_model_of_one_block_class():
    from kopt.agent.fp8_dominance import fp8_linear_options, pipeline_choice_of
    from kopt.agent.fp8_groups import layer_spans

    assert layer_spans(42) == [tuple(range(5, 37)), tuple(range(10, 32))] and layer_spans(7) == []
    graph = _block_graph()
    choices = fp8_choices(base_pipeline(), CONFIG, graph.graph_module, layers=8)
    spans = [c for c in choices if ", in blocks" in c.change]
    assert [c.change for c in spans[:2]] == ["fp8 row scales on up.weight, gate.weight only, in blocks 1-6 of 8",
                                             "fp8 row scales on up.weight, gate.weight only, in blocks 2-5 of 8"]
    assert len(spans) == 2 * 4 and choices.index(spans[0]) > max(choices.index(c) for c in choices
                                                                   if c.change.endswith(" only"))
    options = fp8_linear_options(pipeline_choice_of(to_candidate(graph.signature, spans[1])))
    assert options["fp8"]["blocks"] == [2, 3, 4, 5] and options["fp8"]["include"] == ["up.weight", "gate.weight"]
    assert not any(", in blocks" in c.change for c in fp8_choices(base_pipeline(), CONFIG, graph.graph_module))


def test_a_group_in_fewer_layers_waits_for_that_group_in_every_layer_to_miss(tmp_path):
    graph = _block_graph()
    found = {c.change: to_candidate(graph.signature, c)
             for c in fp8_choices(base_pipeline(), CONFIG, graph.graph_module, layers=8)}
    span = found["fp8 row scales on down.weight only, in blocks 1-6 of 8"]
    group, other = found["fp8 row scales on down.weight only"], found["fp8 row scales on qkv.weight only"]
    with KnowledgeBase(tmp_path / "kb.sqlite") as kb:
        environment = kb.record_environment(current_environment())
        kb.record_region(graph_region(graph.original))

        def latest():
            return kb.latest(signature=graph.signature, environment=environment)

        assert "in every block has not missed" in narrowing_unwanted(span, latest())
        kb.record_candidate(other, status=Status.SLOWER, reason="model output outside the contract",
                            verdict=_model_check(False), environment=environment)
        assert narrowing_unwanted(span, latest())  # another group's miss says nothing of this one
        kb.record_candidate(group, status=Status.SLOWER, reason="no end-to-end win", verdict=_model_check(True),
                            environment=environment)
        assert narrowing_unwanted(span, latest())  # met the contract in every block: fewer are not wanted
        kb.record_candidate(group, status=Status.SLOWER, reason="model output outside the contract",
                            verdict=_model_check(False), environment=environment)
        assert narrowing_unwanted(span, latest()) is None
        both = {"kind": "whole-model", "accepted": False,
                "checks": [{"graph": 0, "output": 0, "ok": False}, {"graph": "model", "output": 0, "ok": False}]}
        kb.record_candidate(group, status=Status.SLOWER, reason="outside the contract", verdict=both,
                            environment=environment)
        assert "its block graph's own check" in narrowing_unwanted(span, latest())  # fewer blocks cannot help


def test_the_loop_tries_a_group_in_the_middle_layers_after_it_missed_in_all(tmp_path, monkeypatch):
    """Through the real loop (CPU, FX lowering) on eight tiny blocks, with a budget of about 0.008 in
    relative error (one block graph with a group in FP8 keeps within it, the model's output with that
    group in every block does not): all linears miss, the group misses on the model's output, and the
    group in the middle layers, compiled with two graphs (middle blocks in FP8, the rest not), meets
    it on the model's output and is timed."""
    import kopt.agent.loop as loop
    from kopt.agent import optimize
    from tests.agent.tiny_models import TinyBlockStack

    config = Fp8Config(min_features=16, gate=QualityGate(min_cosine=0.99997, min_sqnr_db=-20 * math.log10(0.008)))
    torch.manual_seed(0)
    model, inputs = TinyBlockStack(32, blocks=8).eval(), (torch.randn(2, 24, 32),)
    wanted = ["fp8 row scales", "fp8 row scales on up.weight, gate.weight only",
              "fp8 row scales on up.weight, gate.weight only, in blocks 2-5 of 8"]

    def batches(graphs):
        assert graphs[0].calls == 8
        found = {c.change: to_candidate(graphs[0].signature, c)
                 for c in fp8_choices(base_pipeline(), config, graphs[0].graph_module, layers=graphs[0].calls)}
        yield narrowed_after_whole([found[change] for change in reversed(wanted)])  # as the loop orders them

    monkeypatch.setattr(loop, "_proposal_batches", lambda *a, **k: batches(a[6]))
    result = optimize(model, inputs, budget_min=10, kb_path=tmp_path / "kb.sqlite", regional=True, lower="eager",
                      micro=False, fp8=config, progress=False)
    changes = [dict(e.candidate.params)["change"] for e in result.evaluations]
    assert changes == wanted, changes
    whole, group, span = result.evaluations
    assert all("model output outside the contract" in e.reason for e in (whole, group))
    assert all(c["ok"] for c in group.e2e.quality if c["graph"] != "model")  # its block graph kept the budget
    assert span.e2e is not None and span.e2e.speedup.samples > 0  # compiled, checked and timed like any choice
    assert all(c["ok"] for c in span.e2e.quality)  # half the blocks: within the budget

    def model_error(evaluation) -> float:
        return next(c["rel_err"] for c in evaluation.e2e.quality if c["graph"] == "model")

    # half the blocks in FP8: the model's output rounds less than with the group in all eight, less again
    # than with every linear
    assert 0 < model_error(span) < model_error(group) < model_error(whole)


def test_a_chosen_layer_span_never_stops_a_whole_model_compile():
    """A span choice kept for a block graph (as the knowledge base keeps it) applies to regional
    compiles; a whole-model compile with the same pipeline runs, since no graph of it has that block
    graph's signature (only a user's own ``Fp8Config(blocks=...)`` is refused there)."""
    from kopt.agent.regional_clock import side_passes

    graph = _block_graph()
    span = next(to_candidate(graph.signature, c) for c in fp8_choices(base_pipeline(), CONFIG, graph.graph_module,
                                                                       layers=8) if ", in blocks" in c.change)
    model, (x,) = tiny_block_stack()
    with torch.no_grad():
        compiled = kopt.compile(model, passes=side_passes({graph.signature: span}), lower="eager", progress=False)
        assert rel_err(compiled(x), reference_forward(model, x)) < 1e-5  # no graph of it took the FP8 span
