"""An FP8 choice that only adds FP8 attention to one whose model output already missed the contract is
settled without being timed (:mod:`kopt.agent.fp8_dominance`), and the loop tries the lesser one first."""

from __future__ import annotations

import dataclasses

import pytest

from kopt.agent.candidate import Candidate
from kopt.agent.fp8_dominance import adds_rounding, lesser_rounding_first, missed_model_contract, settled_by
from kopt.agent.kb import KnowledgeBase, Status, current_environment
from kopt.agent.pipeline_choice import from_candidate, rebased, to_candidate
from kopt.agent.propose.pipeline import base_pipeline, fp8_choices
from kopt.fp8.config import Fp8Config, QualityGate
from tests.agent.tiny_models import tiny_block_stack

SIGNATURE = "a" * 64


CONFIG = Fp8Config(min_features=16)


def _fp8_candidates(config: Fp8Config = CONFIG, signature: str = SIGNATURE) -> dict[str, Candidate]:
    return {choice.change: to_candidate(signature, choice) for choice in fp8_choices(base_pipeline(), config)}


def _model_check(ok: bool) -> dict:
    return {"kind": "whole-model", "accepted": ok,
            "checks": [{"graph": 0, "output": 0, "ok": True}, {"graph": "model", "output": 0, "ok": ok}]}


def test_only_the_same_choice_with_fp8_attention_adds_rounding():
    found = _fp8_candidates()
    row, attention = found["fp8 row scales"], found["fp8 row scales + fp8 attention"]
    assert adds_rounding(attention, row)
    assert not adds_rounding(row, attention) and not adds_rounding(row, row)
    for other in ("fp8 tensor scales", "fp8 block-1x128 scales", "fp8 block-128x128 scales"):
        assert not adds_rounding(attention, found[other]), other  # another granularity: not comparable
    elsewhere = dataclasses.replace(attention, region_signature="b" * 64)
    assert not adds_rounding(elsewhere, row)  # another graph
    stricter = _fp8_candidates(Fp8Config(min_features=16, fast_accum=False))["fp8 row scales + fp8 attention"]
    assert not adds_rounding(stricter, row)  # another FP8 config
    kept = to_candidate(SIGNATURE, dataclasses.replace(from_candidate(row), change="drop sibling-merge"))
    assert not adds_rounding(rebased(attention, kept), row)  # measured on top of another kept chain


def test_only_a_missed_model_output_settles():
    assert missed_model_contract(_model_check(False))
    assert not missed_model_contract(_model_check(True))
    graph_only = {"kind": "whole-model", "accepted": False, "checks": [{"graph": 0, "output": 0, "ok": False}]}
    assert not missed_model_contract(graph_only)  # a graph's check is not the model's output
    assert not missed_model_contract({"kind": "unchanged-graph", "accepted": True, "checks": []})
    assert not missed_model_contract(None)


def test_a_recorded_miss_settles_the_choice_that_adds_rounding(tmp_path):
    from kopt.agent.graphs import capture_graphs
    from kopt.agent.pipeline_choice import graph_region

    graph = capture_graphs(*tiny_block_stack(), regional=True)[0]
    found = _fp8_candidates(signature=graph.signature)
    row, attention, tensor = (found[k] for k in ("fp8 row scales", "fp8 row scales + fp8 attention",
                                                  "fp8 tensor scales"))
    with KnowledgeBase(tmp_path / "kb.sqlite") as kb:
        environment = kb.record_environment(current_environment())
        kb.record_region(graph_region(graph.original))
        kb.record_candidate(tensor, status=Status.SLOWER, reason="model output outside the contract: cos 0.5",
                            verdict=_model_check(False), environment=environment)
        assert settled_by(attention, kb.latest(signature=graph.signature, environment=environment)) is None
        kb.record_candidate(row, status=Status.SLOWER, reason="no end-to-end win", verdict=_model_check(True),
                            environment=environment)
        assert settled_by(attention, kb.latest(signature=graph.signature, environment=environment)) is None
        kb.record_candidate(row, status=Status.SLOWER, reason="model output outside the contract: cos 0.9",
                            verdict=_model_check(False), environment=environment)
        record = settled_by(attention, kb.latest(signature=graph.signature, environment=environment))
        assert record is not None and record.candidate_hash == row.content_hash
        assert settled_by(row, kb.latest(signature=graph.signature, environment=environment)) is None


def test_the_lesser_choice_goes_first_and_nothing_is_lost():
    found = _fp8_candidates()
    order = [found["fp8 row scales + fp8 attention"], found["fp8 tensor scales"], found["fp8 row scales"],
             found["fp8 block-1x128 scales"]]
    changes = [dict(c.params)["change"] for c in lesser_rounding_first(order)]
    assert changes == ["fp8 tensor scales", "fp8 row scales", "fp8 row scales + fp8 attention",
                       "fp8 block-1x128 scales"]
    alone = [found["fp8 row scales + fp8 attention"], found["fp8 tensor scales"]]
    assert lesser_rounding_first(alone) == alone  # its lesser one is not in the list: kept where it was


@pytest.mark.parametrize("gate_passes", [False, True])
def test_the_loop_times_the_attention_variant_only_if_its_lesser_choice_met_the_contract(tmp_path, monkeypatch,
                                                                                          gate_passes):
    """Through the real loop on a tiny attention block stack (CPU, FX lowering): the FP8 choice with
    attention is proposed first, tried second; with a gate no FP8 output can meet it is settled
    untimed by the row choice's miss, and timed as usual when the row choice met it."""
    import kopt.agent.loop as loop
    from kopt.agent import optimize

    gate = QualityGate(min_cosine=0.9, min_sqnr_db=0.0) if gate_passes else QualityGate(min_cosine=1.0,
                                                                                       min_sqnr_db=1000.0)
    config = Fp8Config(min_features=16, gate=gate)
    model, inputs = tiny_block_stack()

    def batches(*args, graphs=(), **kwargs):
        found = {c.change: to_candidate(graphs[0].signature, c) for c in fp8_choices(base_pipeline(), config)}
        yield lesser_rounding_first([found["fp8 row scales + fp8 attention"], found["fp8 row scales"]])

    monkeypatch.setattr(loop, "_proposal_batches", lambda *a, **k: batches(graphs=a[6]))
    result = optimize(model, inputs, budget_min=10, kb_path=tmp_path / "kb.sqlite", regional=True, lower="eager",
                      micro=False, fp8=config, progress=False)
    changes = [dict(e.candidate.params)["change"] for e in result.evaluations]
    assert changes == ["fp8 row scales", "fp8 row scales + fp8 attention"]  # the lesser one first
    row, attention = result.evaluations
    assert row.e2e is not None
    if gate_passes:  # timed end to end like any choice
        assert attention.e2e is not None and "not timed" not in attention.reason
    else:
        assert "model output outside the contract" in row.reason
        assert attention.status is Status.REJECTED and attention.e2e is None
        assert attention.reason.startswith("not timed: it only adds FP8 attention to 'fp8 row scales'")


def test_the_proposals_put_each_fp8_attention_variant_after_its_granularity(tmp_path, monkeypatch):
    """Whatever order the knowledge base's lessons ask for (here: reversed), the granularity comes first."""
    import kopt.agent.propose.warm as warm
    from kopt.agent.graphs import capture_graphs
    from kopt.agent.loop import _proposal_batches
    from kopt.agent.profile import find_occurrences, profile_graphs

    model, inputs = tiny_block_stack()
    graphs = capture_graphs(model, inputs, regional=True)
    occurrences = find_occurrences(graphs[0].graph_module)
    monkeypatch.setattr(warm, "warm_order", lambda candidates, kb, keys: list(reversed(list(candidates))))
    with KnowledgeBase(tmp_path / "kb.sqlite") as kb:
        batch = next(_proposal_batches("search", occurrences, profile_graphs(graphs, occurrences), kb, 0, None,
                                       graphs, {}, fp8=CONFIG))
    changes = [dict(c.params).get("change") for c in batch]
    assert changes.index("fp8 row scales") < changes.index("fp8 row scales + fp8 attention")
