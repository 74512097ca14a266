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
from tests.test_regional_between_blocks import _model


def test_the_lm_head_gets_an_fp8_choice_of_its_own_that_leaves_the_blocks_alone():
    model = _model()
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
