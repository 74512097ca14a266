"""The warm-up before a retried recording takes the branch model code takes under stream capture
(kopt.capture_branch): transformers' Llama passes each layer a full causal mask there, None otherwise."""

from __future__ import annotations

import pytest
import torch

from kopt.capture_branch import as_if_capturing


def test_transformers_builds_a_mask_under_capture_and_the_answer_is_restored():
    pytest.importorskip("transformers")
    from kopt.workloads import get_workload

    workload = get_workload("llama")
    model = workload.model("tiny")
    inputs = workload.inputs("tiny", seed=3)
    layer = model.model.layers[0]
    forward, masks = layer.forward, []

    def spy(*args, **kwargs):
        masks.append(kwargs.get("attention_mask"))
        return forward(*args, **kwargs)

    layer.forward = spy
    original = torch.cuda.is_current_stream_capturing
    with torch.no_grad():
        plain = model(**inputs)[0]
        with as_if_capturing():
            assert torch.cuda.is_current_stream_capturing()
            captured = model(**inputs)[0]
    assert torch.cuda.is_current_stream_capturing is original
    assert masks[0] is None and isinstance(masks[1], torch.Tensor) and masks[1].shape[-2:] == (16, 16)
    torch.testing.assert_close(captured, plain, rtol=1e-5, atol=1e-5)  # the same result on both branches


def test_the_answer_is_restored_when_the_call_raises():
    original = torch.cuda.is_current_stream_capturing
    with pytest.raises(ValueError), as_if_capturing():
        raise ValueError("the warm-up failed")
    assert torch.cuda.is_current_stream_capturing is original
