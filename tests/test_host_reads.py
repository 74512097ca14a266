"""Where a call reads a tensor's value on the host (the reason a CUDA-graph recording fails): the line
that asked for it, not torch's frames; each place once; a failed recording's reason names it."""

from __future__ import annotations

import pytest
import torch

from kopt.host_reads import call_noting_host_reads


def _gate(x: torch.Tensor) -> torch.Tensor:
    if bool((x > -10).all()):  # a host read: the value decides the branch
        return x * 2
    return x


def test_the_reading_line_is_named_once_with_its_caller():
    x = torch.randn(8)
    out, reads = call_noting_host_reads(lambda t: _gate(_gate(t)), [x], devices_only=False)
    torch.testing.assert_close(out, x * 4)
    # two reads, from one place reached from one line: named once
    assert reads == ["tests/test_host_reads.py:13 in _gate (called from tests/test_host_reads.py:20 in <lambda>)"]


def test_a_call_without_reads_reports_none_and_cpu_reads_are_no_syncs():
    x = torch.randn(8)
    assert call_noting_host_reads(lambda t: t * 3, [x], devices_only=False)[1] == []
    assert call_noting_host_reads(_gate, [x])[1] == []  # CPU values: no device to wait for


def test_transformers_llama_reads_its_attention_mask_on_the_host():
    """The Llama forward (eager top level, as kopt's regional replay runs it) reads the all-ones mask's
    values in transformers' mask helper: what made its whole-forward recording fail on the GPU."""
    pytest.importorskip("transformers")
    from kopt.workloads import get_workload

    workload = get_workload("llama")
    model = workload.build_model("tiny").eval()
    inputs = workload.build_inputs("tiny", torch.device("cpu"), torch.float32, torch.Generator().manual_seed(0), False)
    with torch.no_grad():
        _, reads = call_noting_host_reads(lambda: model(**inputs), [], devices_only=False)
    assert reads and "masking_utils.py" in reads[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_failed_recording_names_the_line_that_read_the_gpu():
    from kopt.cuda_graphs import CudaGraphRunner

    runner = CudaGraphRunner(_gate, warmup=1)
    x = torch.randn(64, device="cuda")
    for _ in range(3):
        torch.testing.assert_close(runner(x), x * 2)
    assert runner.stats.disabled.startswith("recording failed: ")
    assert "reads a GPU value on the host" in runner.stats.disabled and "test_host_reads.py:13 in _gate" in \
        runner.stats.disabled
