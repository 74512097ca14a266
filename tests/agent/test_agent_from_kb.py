"""A killed run's evaluations read back from its knowledge base: only the records the run added to
the KB it started from, oldest first, in the format ``benchmarks.agent_curves`` reads."""

from __future__ import annotations

import shutil

from benchmarks.agent_curves import measured_curve
from benchmarks.agent_from_kb import as_run, run_records
from kopt.agent.kb import KnowledgeBase, Status
from kopt.agent.kb.records import Measurement
from tests.agent.kb_helpers import GPU_ENV, candidate_for, scaled_gelu_region


def test_the_run_is_what_it_added_to_its_seed_in_order(tmp_path):
    region = scaled_gelu_region()
    seed, run = tmp_path / "seed.sqlite", tmp_path / "run.sqlite"
    with KnowledgeBase(seed) as kb:
        kb.record_region(region)
        kb.record_candidate(candidate_for(region, 0), status=Status.SLOWER, reason="earlier model", environment=GPU_ENV,
                            created_at=1.0)
    shutil.copy(seed, run)
    with KnowledgeBase(run) as kb:
        kb.record_candidate(candidate_for(region, 1), status=Status.ACCEPTED, reason="won", environment=GPU_ENV,
                            e2e=Measurement("speedup", 1.25, 1.2, 1.3, 20), created_at=10.0)
        kb.record_candidate(candidate_for(region, 2), status=Status.SLOWER, reason="lost", environment=GPU_ENV,
                            created_at=14.5)
    data = as_run(run_records(run, seed), "tiny", str(run))
    assert data["finished"] is False and data["workload"] == "tiny"
    assert [e["params"]["variant"] for e in data["evaluations"]] == [1, 2]
    assert [e["seconds"] for e in data["evaluations"]] == [None, 4.5]
    assert [round(g, 9) for g in measured_curve(data)] == [0.0, 0.2, 0.2]  # 1 - 1/1.25
    assert len(as_run(run_records(run, None), "tiny", str(run))["evaluations"]) == 3
