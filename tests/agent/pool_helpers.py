"""Shared by the pool tests: a run's outcomes as the knowledge base holds them, and recorded LLM
exchanges (hand-authored, labelled so) that put a hanging and a crashing candidate into a run."""

from __future__ import annotations

import json
from pathlib import Path

from kopt.agent import optimize
from kopt.agent.graphs import capture_graphs
from kopt.agent.kb import KnowledgeBase
from kopt.agent.profile import find_occurrences
from tests.agent.tiny_models import sigmoid_gelu_mlp, tiny_attention_block

RECORDINGS = Path(__file__).parent / "llm_recordings"
HANG = "import time\n\n\ndef candidate(in0):\n    time.sleep(10_000)\n"
CRASH = "import os\n\n\ndef candidate(in0):\n    os.abort()\n"
BLOCK_CANDIDATES = 8


def block_run(kb_path: Path, **pool) -> object:
    """Eight search candidates on the tiny attention block (its two regions' kernels: what the pool
    verifies; pipeline choices verify inline), judged by the deterministic cost model: the same seed
    gives the same proposals and verdicts."""
    model, inputs = tiny_attention_block()
    return optimize(model, inputs, budget_min=10, kb_path=kb_path, clock="cost-model", seed=0, model_name="block",
                    max_candidates=BLOCK_CANDIDATES, progress=False, pipelines=False, **pool)


def kb_outcomes(kb_path: Path) -> list[tuple[str, str, str]]:
    """(content hash, status, reason) of every candidate record, in the order they were written."""
    with KnowledgeBase(kb_path) as kb:
        return [(r.candidate_hash, r.status.value, r.reason) for r in kb.candidates()]


def _exchange(region, name: str, source: str, template: dict) -> dict:
    response = json.loads(json.dumps(template["response"]))
    response["id"] = f"msg_pool_{name}"
    block = response["content"][0]
    block["id"] = f"toolu_pool_{name}"
    block["input"] = {**block["input"], "source": source, "kind": "rule-by-example", "why": f"pool test: {name}"}
    return {**template, "provenance": f"HAND-AUTHORED TEST FIXTURE (tests/agent/pool_helpers.py): a candidate "
                                      f"that {name}s, to check that a pool worker survives it",
            "region_signature": region.signature, "class_key": region.class_key, "response": response}


def write_bad_recordings(folder: Path) -> Path:
    """A replay folder for the tiny MLP's region: a candidate that hangs, one that aborts its process,
    then the honest Triton fixture (files replay in name order)."""
    model, inputs = sigmoid_gelu_mlp()
    region = find_occurrences(capture_graphs(model, inputs)[0].graph_module)[0].region
    fixture = json.loads((RECORDINGS / "sigmoid_gelu_fixture.json").read_text())
    assert fixture["class_key"] == region.class_key
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "0_hang.json").write_text(json.dumps(_exchange(region, "hang", HANG, fixture)))
    (folder / "1_crash.json").write_text(json.dumps(_exchange(region, "crash", CRASH, fixture)))
    (folder / "2_fixture.json").write_text(json.dumps(fixture))
    return folder
