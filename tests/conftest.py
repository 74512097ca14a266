"""Shared fixtures: tiny real models with fresh random inputs, and the error measure tests use."""

from __future__ import annotations

import atexit
import copy
import os
import shutil
import tempfile

import torch

# kopt's cache folder (autotune choices, generated kernels, the default knowledge base) is private to
# the test session: a user's ~/.cache/kopt/kb.sqlite would add its accepted rewrites to every
# passes="auto" under test, and tests must not write into the user's caches either. Subprocesses that
# tests start inherit it.
os.environ["KOPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="kopt-test-cache-")
atexit.register(shutil.rmtree, os.environ["KOPT_CACHE_DIR"], ignore_errors=True)
os.environ.pop("KOPT_KB", None)
# Every lowering is checked: a verdict one test leaves (kopt/lowering_memory.py) would let another
# test's deliberately broken lowering of the same graph pass unchecked. test_lowering_memory.py
# turns the memory back on for itself.
os.environ["KOPT_RECHECK_LOWERING"] = "1"

if not torch.cuda.is_available():
    # Triton kernels run in the interpreter on the CPU; it must be chosen before any @triton.jit
    # function is defined, i.e. before kopt.kernels modules are imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kopt.workloads import get_workload  # noqa: E402


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


def tiny_model_and_inputs(name: str, *, seed: int, dtype: torch.dtype = torch.float32):
    """(workload, model, inputs): a tiny real DiT (weights from seed 0) and fresh inputs from ``seed``."""
    workload = get_workload(name)
    torch.manual_seed(0)
    return workload, workload.model("tiny", dtype=dtype), workload.inputs("tiny", seed=seed, dtype=dtype)


def compile_close_to_eager(name: str, bound: float, *, seed: int, dtype: torch.dtype = torch.float32,
                           **compile_kwargs):
    """``kopt.compile`` a tiny DiT (``lower="eager"``, ``verify=True`` unless given), check one call
    against eager within ``bound`` (relative error), and return the compiled module."""
    import kopt

    _, model, inputs = tiny_model_and_inputs(name, seed=seed, dtype=dtype)
    compiled = kopt.compile(model, **{"lower": "eager", "verify": True, **compile_kwargs})
    with torch.no_grad():
        assert rel_err(compiled(**inputs)[0], model(**inputs)[0]) < bound
    return compiled


def tiny_with_more_blocks(name: str, extra: int):
    """A tiny DiT with ``extra`` more blocks of each list (fresh weights), so that blocks repeat."""
    workload = get_workload(name)
    torch.manual_seed(0)
    model = workload.model("tiny")
    for blocks in (model.transformer_blocks, getattr(model, "single_transformer_blocks", None)):
        if blocks is not None:
            template = blocks[0]
            for _ in range(extra):
                clone = copy.deepcopy(template)
                for p in clone.parameters():
                    torch.nn.init.normal_(p, std=0.05)
                blocks.append(clone)
    return workload, model
