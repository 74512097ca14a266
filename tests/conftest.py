"""Shared fixtures: tiny real models with fresh random inputs, and the error measure tests use."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # Triton kernels run in the interpreter on the CPU; it must be chosen before any @triton.jit
    # function is defined, i.e. before kopt.kernels modules are imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kopt.workloads import get_workload


def rel_err(candidate: torch.Tensor, reference: torch.Tensor) -> float:
    """Relative error in float64; 1.0 for an all-zeros candidate, so "return zeros" fails."""
    reference = reference.double()
    return ((candidate.double() - reference).norm() / reference.norm()).item()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(params=["qwen-image", "flux2"])
def tiny_dit(request):
    """(workload, model, inputs) for a tiny real diffusers transformer, random weights."""
    workload = get_workload(request.param)
    torch.manual_seed(0)
    model = workload.model("tiny")
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    return workload, model, workload.inputs("tiny", seed=seed)
