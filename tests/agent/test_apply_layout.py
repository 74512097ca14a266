"""A verified candidate replaces a region only where the model's outputs have the region's layout.

Canonical form orders commutative operands, so RoPE's ``q_transposed * cos + rotate_half(q) * sin`` in
Qwen3 canonicalizes to a region whose output is contiguous, while the model's output there follows the
transposed ``q``; a ``view`` after it was traced with that layout. Replacing it anyway made the
end-to-end run fail ("view size is not compatible"); such an occurrence is no region at all
(:func:`kopt.codegen.build_region`), and :func:`layout_agrees` still guards what is applied.
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


def test_an_occurrence_with_another_output_layout_is_no_region_and_the_model_still_runs():
    """The RoPE'd queries, laid out as the transposed ``q``, are refused as regions (a near miss that
    says why); every region found agrees with its canonical layout, and replacing them all by their
    verified form leaves the model's output as it was."""
    from kopt.codegen import find_regions

    model, inputs = _qwen3()
    graph = capture_graphs(model, inputs)[0]
    refusals = find_regions(graph.graph_module.graph).refusals.values()
    assert any("laid out non-contiguously" in reason for reason in refusals), list(refusals)
    occurrences = find_occurrences(graph.graph_module, graph.index, model="qwen3")
    assert occurrences and not any(layout_agrees(o) for o in occurrences)

    chosen = {o.region.signature: original_candidate(o.region) for o in occurrences}
    module = structural_copy(graph.graph_module)
    assert apply_candidates(module, chosen) == len(occurrences)

    fresh = [a.clone() if isinstance(a, torch.Tensor) else a for a in graph.args]
    with torch.no_grad():
        expected = graph.graph_module(*fresh)
        got = module(*fresh)
    first_expected, first_got = expected[0], got[0]
    error = (first_got.double() - first_expected.double()).norm() / first_expected.double().norm()
    assert first_expected.abs().sum() > 0 and error < 1e-5


def test_a_region_captured_on_a_gpu_has_its_layout_read_on_any_device():
    """A region captured on a GPU names that device in its literals (``ones(device=cuda)``); reading
    the layout it returns (a FakeTensor run on CPU fakes) maps them like every other run of a region,
    instead of failing on mixed devices."""
    from kopt.agent.apply import native_strides
    from kopt.agent.region import from_function

    def biased(x):
        return x * 2.0 + torch.ones(x.shape[-1], device=x.device)

    region = from_function(biased, torch.randn(4, 8))
    literals = 0
    for node in region.graph_module.graph.nodes:
        if isinstance(node.kwargs.get("device"), torch.device):
            node.kwargs = {**node.kwargs, "device": torch.device("cuda", 0)}
            literals += 1
    region.graph_module.recompile()
    assert literals == 1
    assert native_strides(region) == [(8, 1)]
