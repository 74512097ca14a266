"""kopt.compile(model, regional=True): each repeated block compiled once per class, every block's weights."""

from __future__ import annotations

import pytest
import torch

import kopt
from kopt.regional import KoptRegional, repeated_blocks
from tests.conftest import rel_err, tiny_with_more_blocks


@pytest.mark.parametrize("name", ["flux2", "qwen-image"])
def test_one_graph_per_block_class_serves_every_block_with_its_own_weights(name):
    workload, model = tiny_with_more_blocks(name, extra=3)
    inputs = workload.inputs("tiny", seed=int(torch.randint(1 << 30, ())))
    with torch.no_grad():
        want = model(**inputs)[0]
    compiled = kopt.compile(model, regional=True, lower="eager", verify=True, progress=False)
    assert isinstance(compiled, KoptRegional) and compiled.blocks
    with torch.no_grad():
        got = compiled(**inputs)[0]
    assert rel_err(got, want) < 1e-5
    report = compiled.kopt_report
    classes = len(compiled.blocks)
    # dynamo compiles a block class at most twice (its first instance, then one graph for the rest)
    assert classes <= len(report.graphs) <= 2 * classes
    assert all(g.fallback is None for g in report.graphs)
    assert sum(p.total_matches for g in report.graphs for p in g.passes) > 0
    # one set of derived tensors (merged Q/K/V) per block instance of the class that has them
    sets = sum(g.weights.get("sets", 0) for g in report.graphs if g.weights.get("derived"))
    assert sets == len(model.transformer_blocks)
    assert compiled.undo() is model and all(getattr(b, "_compiled_call_impl", None) is None
                                            for b in repeated_blocks(model))


def test_a_model_without_repeated_blocks_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="no _repeated_blocks"):
        kopt.compile(torch.nn.Linear(4, 4), regional=True)
