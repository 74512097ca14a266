"""A verified candidate replaces a region only where the model's outputs have the region's layout.

Canonical form orders commutative operands, so RoPE's ``q_transposed * cos + rotate_half(q) * sin`` in
Qwen3 canonicalizes to a region whose output is contiguous, while the model's output there follows the
transposed ``q``; a ``view`` after it was traced with that layout. Replacing it anyway made the
end-to-end run fail ("view size is not compatible"); the occurrence must be left as it is.
"""

from __future__ import annotations

import pytest
import torch

from kopt.agent.apply import apply_candidates, layout_agrees
from kopt.agent.candidate import original_candidate
from kopt.agent.graphs import capture_graphs
from kopt.agent.pipeline_choice import structural_copy
from kopt.agent.profile import find_occurrences

pytest.importorskip("transformers")


def _qwen3():
    from kopt.workloads import get_workload

    workload = get_workload("qwen3")
    model = workload.model("tiny", device=torch.device("cpu"), dtype=torch.float32)
    inputs = workload.inputs("tiny", device=torch.device("cpu"), dtype=torch.float32, seed=0)
    return model, inputs


def test_an_occurrence_with_another_output_layout_is_left_alone_and_the_model_still_runs():
    model, inputs = _qwen3()
    graph = capture_graphs(model, inputs)[0]
    occurrences = find_occurrences(graph.graph_module, graph.index, model="qwen3")
    differing = [o for o in occurrences if layout_agrees(o)]
    agreeing = [o for o in occurrences if not layout_agrees(o)]
    assert differing and agreeing
    assert "later ops were traced with this occurrence's layout" in layout_agrees(differing[0])

    # every region replaced by its own computation, verified form: the canonical region's source
    chosen = {o.region.signature: original_candidate(o.region) for o in differing + agreeing}
    module = structural_copy(graph.graph_module)
    replaced = apply_candidates(module, chosen)
    assert replaced == sum(1 for o in occurrences if o.region.signature in chosen and not layout_agrees(o))
    assert replaced < len(occurrences)

    fresh = [a.clone() if isinstance(a, torch.Tensor) else a for a in graph.args]
    with torch.no_grad():
        expected = graph.graph_module(*fresh)
        got = module(*fresh)
    first_expected, first_got = expected[0], got[0]
    error = (first_got.double() - first_expected.double()).norm() / first_expected.double().norm()
    assert first_expected.abs().sum() > 0 and error < 1e-5
