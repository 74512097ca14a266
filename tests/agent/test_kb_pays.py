"""The knowledge base pays: model B reaches 80% of its final gain in at most half the evaluations
when model A (same family, other sizes) searched first with the same KB. Deterministic cost model."""

import json

from benchmarks.agent_curves import compare
from benchmarks.agent_kb_pays import evaluations_to, run


def test_warm_search_reaches_80_percent_in_half_the_evaluations(tmp_path):
    data = run(tmp_path, seed=0)
    cold, warm = data["cold"], data["warm"]
    assert cold["final_gain"] > 0.05 and abs(warm["final_gain"] - cold["final_gain"]) < 0.01
    assert warm["evaluations_to_80pct"] <= cold["evaluations_to_80pct"] / 2
    assert warm["evaluations_to_80pct"] == evaluations_to(warm["gain_curve"]) >= 1
    assert json.loads((tmp_path / "agent_kb_pays.json").read_text())["clock"] == "cost-model"
    assert (tmp_path / "agent_kb_pays.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the GPU's curves come from the runs' measured speedups (benchmarks.agent_curves): from the same two
    # runs, the product of the accepted candidates' median speedups tells the cost model's story
    measured = compare(tmp_path / "agent_kb_pays-cold-run.json", tmp_path / "agent_kb_pays-warm-run.json")
    for name in ("cold", "warm"):
        assert abs(measured[name]["final_gain"] - data[name]["final_gain"]) < 0.01
        assert measured[name]["evaluations"] == data[name]["evaluations"]
    assert measured["pays"] is True and measured["warm"]["evaluations_to_80pct"] <= 3


def test_evaluations_to_counts_the_first_evaluation_reaching_the_fraction():
    assert evaluations_to([0.0, 0.1, 0.1, 0.5, 0.5]) == 3
    assert evaluations_to([0.0, 0.4, 0.45, 0.5]) == 1
