"""Programmatic dependent launch (kopt.kernels._pdl): off where it cannot run, and on a Hopper GPU a
chain of dependent kernels launched with it (each reading the previous one's output), captured in a
CUDA graph, computes exactly what the same chain computes without it."""

from __future__ import annotations

import pytest
import torch

from kopt.kernels import _pdl, activation_quant, gelu_tanh

needs_hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                                  reason="needs an sm_90+ CUDA device")


def test_off_on_the_cpu_and_when_disabled(monkeypatch):
    assert _pdl.launch_options(torch.device("cpu")) == {"PDL": False}
    monkeypatch.setenv("KOPT_PDL", "0")
    assert not _pdl.enabled(torch.device("cuda", 0))


def _chain(x: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    for _ in range(steps):  # each kernel reads what the one before it wrote
        x = gelu_tanh.launch(x)
    return activation_quant.launch(x, None, "gelu_tanh")


@pytest.mark.gpu
@needs_hopper
def test_gpu_dependent_chain_in_a_cuda_graph_matches_without_pdl(monkeypatch):
    x = torch.randn(4096, 3072, device="cuda", dtype=torch.bfloat16)
    monkeypatch.setenv("KOPT_PDL", "0")
    expected = _chain(x, 12)
    monkeypatch.setenv("KOPT_PDL", "1")
    assert _pdl.enabled(x.device)
    _chain(x, 12)  # compile and tune outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, scale = _chain(x, 12)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(q.view(torch.uint8), expected[0].view(torch.uint8)) and torch.equal(scale, expected[1])
