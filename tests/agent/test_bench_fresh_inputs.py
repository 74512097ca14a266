"""The agent checks each block graph on fresh inputs (``kopt.agent.bench.fresh_args``): data gets new
values, structure does not — an additive attention mask kept as given, so an LLM block is checked on
the computation it runs."""

from __future__ import annotations

import math

import torch

from kopt.agent.bench import fresh_args, holds_sentinels, quality
from kopt.agent.graphs import capture_graphs
from kopt.passes.base import Contract
from kopt.workloads import get_workload


def test_masks_and_sentinels_are_structure_and_data_is_refreshed():
    mask = torch.zeros(1, 1, 8, 8, dtype=torch.bfloat16).masked_fill(
        torch.ones(8, 8, dtype=torch.bool).triu(1), torch.finfo(torch.bfloat16).min)
    infinite = torch.zeros(8, 8).masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), -math.inf)
    data = torch.randn(4, 16, generator=torch.Generator().manual_seed(1)).bfloat16()
    assert holds_sentinels(mask) and holds_sentinels(infinite) and not holds_sentinels(data)
    quantized = (data.float() / data.float().abs().amax(-1, keepdim=True) * 448).to(torch.float8_e4m3fn)
    assert not holds_sentinels(quantized)  # FP8 rows reach 448 by design: data, refreshed like any other
    fresh_mask, fresh_infinite, fresh_data = fresh_args([mask, infinite, data], seed=3)
    assert fresh_mask is mask and fresh_infinite is infinite
    assert fresh_data.shape == data.shape and not torch.equal(fresh_data, data)
    assert torch.isfinite(fresh_data).all()


def test_an_llm_block_is_checked_on_its_mask_with_numbers_that_measure_it():
    """Tiny Gemma 2 in bf16 (eager attention: an additive causal mask of finfo.min per layer): the
    block graph's check on fresh inputs compares finite outputs, bf16 against its float32 reference.
    With the mask refreshed as data its spread overflows to NaN and nothing would be compared."""
    workload = get_workload("gemma2")
    torch.manual_seed(0)
    model = workload.model("tiny", dtype=torch.bfloat16)
    graphs = capture_graphs(model, workload.inputs("tiny", seed=1, dtype=torch.bfloat16), regional=True)
    block = graphs[0]
    masks = [a for a in block.args if isinstance(a, torch.Tensor) and holds_sentinels(a)]
    assert len(masks) == 1 and masks[0].dim() == 4  # the (batch, 1, queries, keys) additive mask
    checks = quality([block], {}, Contract.tolerance(1e-2), seed=5)
    assert checks and all(c["ok"] for c in checks)
    # bf16 against float32: a real, small distance (not the 0 of an empty comparison)
    assert all(0 < c["rel_err"] < 0.05 and c["cosine"] > 0.999 for c in checks)
