"""benchmarks/tools/replay_check.py on the CPU: each setting's calls judged against the higher-precision
reference, with eager bf16's own error beside them (a zero or wrong output would stand far from both)."""

from __future__ import annotations

import pytest
import torch


def test_each_setting_is_judged_against_the_reference_beside_eagers_own_error():
    pytest.importorskip("transformers")
    from benchmarks.dit.measure import first_tensor
    from benchmarks.tools.replay_check import _agreement, check
    from kopt.reference import reference_forward
    from kopt.workloads import get_workload

    workload = get_workload("llama")
    model = workload.model("tiny", dtype=torch.bfloat16)
    inputs = workload.inputs("tiny", dtype=torch.bfloat16, seed=0)
    with torch.no_grad():
        want = first_tensor(reference_forward(model, **inputs)).clone()
        eager = _agreement(first_tensor(model(**inputs)), want)
    assert 0 < eager["rel_err"] < 0.05  # bf16's own rounding, measured against float32
    for setting in ("no-staging", "lower-eager"):
        result = check(model, inputs, want, setting, "outer", calls=2)
        assert result["replay_disabled"] is None and len(result["calls"]) == 2, result
        for row in result["calls"]:
            assert row["rel_err"] < 2 * eager["rel_err"] and row["cosine"] > 0.999, (setting, row, eager)
