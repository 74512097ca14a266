"""Timing a region candidate on the GPU the model runs on: what the timing child must still catch
there (work on a side stream, cached results, written inputs) and what it must let through (a
Triton kernel compiled by the JIT in the child). The CPU tests check how the child is set up."""

from __future__ import annotations

import pytest
import torch

from kopt.agent import region as regions
from kopt.agent.candidate import Candidate, CandidateKind, original_candidate
from kopt.agent.micro import timing_config
from kopt.agent.verify import TimingConfig, VerifyConfig, time_candidate
from kopt.agent.verify.sandbox import child_environment, run_child
from kopt.passes.base import Contract

TOL = Contract.tolerance(1e-2)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
ON_GPU = TimingConfig(input_sets=3, rounds=3, warmup=2, device="cuda:0")


def _region():
    x = torch.randn(2048, 1024, dtype=torch.bfloat16)
    return regions.from_function(lambda x: torch.softmax(x.float(), -1).to(x.dtype) * 2.0, x)


def _candidate(region, source, kind=CandidateKind.RULE_BY_EXAMPLE):
    return Candidate(region.signature, kind, source, TOL)


def test_timing_runs_where_the_model_runs():
    assert timing_config(torch.device("cpu")).device == "cpu"
    assert timing_config(torch.device("cuda", 3)).device == "cuda:3"
    with pytest.raises(ValueError, match="cuda:N"):
        TimingConfig(device="gpu")


def test_a_gpu_timing_child_compiles_triton_and_is_a_fresh_interpreter(tmp_path):
    assert child_environment(tmp_path, 1, gpu=True)["TRITON_INTERPRET"] == "0"
    assert child_environment(tmp_path, 1)["TRITON_INTERPRET"] in ("0", "1")
    with pytest.raises(ValueError, match="fresh interpreter"):
        run_child(tmp_path, timeout_s=1.0, threads=1, gpu=True)


@pytest.mark.gpu
@needs_cuda
def test_the_original_times_on_the_gpu_with_every_call_checked():
    region = _region()
    timing, checks = time_candidate(region, original_candidate(region, TOL), VerifyConfig(), ON_GPU)
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    assert timing is not None and len(timing.samples_ns) == 9
    assert sum(c.name == "timing-values" for c in checks) == 9


@pytest.mark.gpu
@needs_cuda
def test_work_left_on_a_side_stream_is_timed():
    """The candidate returns at once and leaves ~50 ms of GPU work on another stream: the harness
    synchronizes the whole device before it stops the clock, so the time shows it."""
    region = _region()
    hidden = _candidate(region, "import torch\n\n_SIDE = torch.cuda.Stream()\n\n\ndef candidate(x):\n"
                                "    out = torch.softmax(x.float(), -1).to(x.dtype) * 2.0\n"
                                "    with torch.cuda.stream(_SIDE):\n        torch.cuda._sleep(100_000_000)\n"
                                "    return out\n")
    timing, checks = time_candidate(region, hidden, VerifyConfig(), ON_GPU)
    assert all(c.passed for c in checks) and timing.median_ns >= 20e6


@pytest.mark.gpu
@needs_cuda
def test_caching_and_input_writes_fail_on_the_gpu_too():
    region = _region()
    cache = _candidate(region, "import torch\n\n_FIRST = []\n\n\ndef candidate(x):\n    if not _FIRST:\n"
                               "        _FIRST.append(torch.softmax(x.float(), -1).to(x.dtype) * 2.0)\n"
                               "    return _FIRST[0].clone()\n")
    timing, checks = time_candidate(region, cache, VerifyConfig(), ON_GPU)
    assert timing is None and any(c.name == "timing-values" and not c.passed for c in checks)
    writer = _candidate(region, "import torch\n\n\ndef candidate(x):\n    out = torch.softmax(x.float(), -1)"
                                ".to(x.dtype) * 2.0\n    x.mul_(0.5)\n    return out\n")
    timing, checks = time_candidate(region, writer, VerifyConfig(), ON_GPU)
    assert timing is None and not all(c.passed for c in checks)


TRITON_SOURCE = '''import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_times_two(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, 0))
    tl.store(out_ptr + row * n + cols, (e / tl.sum(e, 0) * 2.0).to(out_ptr.dtype.element_ty), mask=cols < n)


def candidate(x):
    out = torch.empty_like(x)
    _softmax_times_two[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return out
'''


@pytest.mark.gpu
@needs_cuda
def test_a_triton_kernel_compiles_in_the_timing_child():
    region = _region()
    timing, checks = time_candidate(region, _candidate(region, TRITON_SOURCE, CandidateKind.TRITON_KERNEL),
                                    VerifyConfig(), ON_GPU)
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    assert timing is not None and len(timing.samples_ns) == 9


def test_only_generated_candidates_leave_the_cpu_walls():
    """A search (kopt codegen) candidate's trials follow ``VerifyConfig.device``; any other origin is
    verified on the CPU whatever the setting."""
    from kopt.agent.verify.verifier import trial_device

    region = _region()
    source = original_candidate(region, TOL).source
    for origin, expected in (("search", "cuda:0"), ("llm:claude", "cpu"), ("test", "cpu"), ("human", "cpu")):
        candidate = Candidate(region.signature, CandidateKind.CODEGEN_VARIANT, source, TOL, origin=origin)
        assert trial_device(candidate, VerifyConfig(device="cuda:0")) == expected
        assert trial_device(candidate, VerifyConfig()) == "cpu"
    with pytest.raises(ValueError, match="cuda:N"):
        VerifyConfig(device="gpu")


@pytest.mark.gpu
@needs_cuda
def test_a_generated_triton_candidate_verifies_on_the_gpu():
    from kopt.agent.verify import verify

    region = _region()
    candidate = Candidate(region.signature, CandidateKind.CODEGEN_VARIANT, TRITON_SOURCE, TOL, origin="search")
    verdict = verify(region, candidate, VerifyConfig(device="cuda:0", seed=3))
    assert verdict.accepted, verdict.log
    assert "trials on cuda:0" in verdict.log


def test_an_applied_candidate_is_loaded_from_a_file_its_kernels_can_read():
    """Triton's ``@jit`` reads a kernel's source with ``inspect``: the entry point the end-to-end run
    applies must come from a real file holding exactly the candidate's source."""
    import inspect

    from kopt.agent.apply import load_entry_point

    region = _region()
    candidate = _candidate(region, TRITON_SOURCE, CandidateKind.TRITON_KERNEL)
    fn = load_entry_point(candidate)
    assert inspect.getsource(fn).startswith("def candidate(x):")
    assert open(inspect.getsourcefile(fn)).read() == TRITON_SOURCE
    assert load_entry_point(candidate).__code__.co_filename == fn.__code__.co_filename


@pytest.mark.gpu
@needs_cuda
def test_an_applied_triton_candidate_runs_in_process_on_the_gpu():
    from kopt.agent.apply import load_entry_point

    x = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16)
    fn = load_entry_point(_candidate(_region(), TRITON_SOURCE, CandidateKind.TRITON_KERNEL))
    expected = torch.softmax(x.double(), -1) * 2.0
    rel = (fn(x).double() - expected).norm() / expected.norm()
    assert rel < 1e-2


@pytest.mark.gpu
@needs_cuda
def test_the_region_as_inductor_lowers_it_times_on_the_gpu():
    """What micro pruning compares a candidate with under an Inductor A/B on a GPU: Inductor compiles
    the region in the child's warm-up call, and every timed call's output is checked."""
    from kopt.agent.candidate import lowered_original_candidate

    region = _region()
    timing, checks = time_candidate(region, lowered_original_candidate(region), VerifyConfig(), ON_GPU)
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    assert timing is not None and len(timing.samples_ns) == 9
