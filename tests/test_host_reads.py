"""Where a call reads a tensor's value on the host (the reason a CUDA-graph recording fails): the line
that asked for it, not torch's frames; each place once; a failed recording's reason names it."""

from __future__ import annotations

import pytest
import torch

from kopt.host_reads import BakedReads, ReadLog, call_noting_host_reads


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
        with ReadLog(devices_only=False) as log:  # what a recording would bake in: "the mask is all ones"
            model(**inputs)
    assert reads and "masking_utils.py" in reads[0] and log.values == [True]


def test_baked_reads_give_the_logged_values_and_flag_a_call_whose_values_differ():
    """What a recording does with a host read (CPU tensors stand in for the device's): the logged run
    gives the value; the baked call returns it without reading and sets the flag only when the tensor
    holds another value, while computing the branch of the logged one."""
    positive = torch.rand(8) + 0.5
    with ReadLog(devices_only=False) as log:
        out = _gate(positive)
    assert log.values == [True] and torch.equal(out, positive * 2)

    flag = torch.zeros((), dtype=torch.bool)
    with BakedReads(log.values, flag, devices_only=False) as baked:
        out = _gate(positive + 1)  # same branch: the flag stays clear
    baked.check_all_used()
    assert not flag and torch.equal(out, (positive + 1) * 2)

    with BakedReads(log.values, flag, devices_only=False):
        out = _gate(positive - 100)  # the device would say False: the flag is set, the logged branch ran
    assert flag and torch.equal(out, (positive - 100) * 2)


def test_a_call_that_reads_more_or_fewer_values_than_the_log_is_refused():
    flag = torch.zeros((), dtype=torch.bool)
    x = torch.rand(4)
    with pytest.raises(RuntimeError, match="read 1 values on the host; the run before it read 0"):
        with BakedReads([], flag, devices_only=False):
            _gate(x)
    with BakedReads([True, True], flag, devices_only=False) as baked:
        _gate(x)
    with pytest.raises(RuntimeError, match="read 1 values on the host; the run before it read 2"):
        baked.check_all_used()


def _counted_double():
    """``t.sin() * 2`` compiled by a backend that counts the calls of its compiled code, and the count."""
    compiled_calls = []

    def backend(graph_module, example_inputs):
        def run(*args):
            compiled_calls.append(1)
            return graph_module(*args)

        return run

    return torch.compile(lambda t: t.sin() * 2, backend=backend), compiled_calls


def test_logging_and_baking_leave_compiled_code_compiled_and_torch_as_it_was():
    """A recording holds the kernels the call runs: under the log and the baking a compiled function
    still runs its compiled code (a dispatch mode would make dynamo run it eagerly), and afterwards
    the tensor methods are torch's own again."""
    double, compiled_calls = _counted_double()
    x = torch.rand(8) + 0.5
    before = {name: torch.Tensor.__dict__.get(name) for name in ("__bool__", "item", "__int__", "__float__")}
    double(x)
    with ReadLog(devices_only=False) as log:
        _gate(double(x))
    flag = torch.zeros((), dtype=torch.bool)
    with BakedReads(log.values, flag, devices_only=False):
        _gate(double(x))
    assert len(compiled_calls) == 3 and log.values == [True] and not flag
    assert {name: torch.Tensor.__dict__.get(name) for name in before} == before
    assert bool(torch.tensor(0.0)) is False  # torch's own __bool__


def test_the_diagnosis_call_leaves_compiled_code_compiled_for_later_calls():
    """The diagnosis runs one call under a dispatch mode; without the force_eager stance dynamo marks
    each compiled frame it meets there as skipped for good, and every later call ran eagerly (a
    failed Llama recording left all its blocks eager)."""
    double, compiled_calls = _counted_double()
    x = torch.rand(8) + 0.5
    double(x)
    out, reads = call_noting_host_reads(lambda t: _gate(double(t)), [x], devices_only=False)
    torch.testing.assert_close(out, x.sin() * 4)
    assert reads and "in _gate" in reads[0]
    for _ in range(2):
        torch.testing.assert_close(double(x), x.sin() * 2)
    assert len(compiled_calls) == 3  # the first call and the two after the diagnosis ran compiled code


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_forward_that_reads_the_gpu_is_recorded_with_the_read_baked_in_and_checked():
    """The first recording fails on the host read (and says where); the next bakes the value in: later
    calls replay, and a call whose value differs runs plainly, with the right result."""
    from kopt.cuda_graphs import CudaGraphRunner

    runner = CudaGraphRunner(_gate, warmup=1)
    x = torch.rand(64, device="cuda") + 0.5
    for _ in range(2):  # the warm-up call, then the failed recording's plain call
        torch.testing.assert_close(runner(x), x * 2)
    assert runner.stats.disabled is None and "test_host_reads.py:13 in _gate" in runner.stats.skipped
    for _ in range(3):
        torch.testing.assert_close(runner(x), x * 2)
    assert runner.stats.recorded == 1 and runner.stats.replays >= 2 and runner.stats.baked_reads == 1
    low = torch.full((64,), -50.0, device="cuda")
    torch.testing.assert_close(runner(low), low)  # (low > -10).all() is False: the other branch
    assert runner.stats.guard_misses == 1 and "host read" in runner.stats.describe()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_recording_that_fails_again_is_disabled_naming_the_read():
    from kopt.cuda_graphs import CudaGraphRunner

    def uncapturable(x: torch.Tensor) -> torch.Tensor:
        if bool((x > -10).all()):
            return x[x > 0].sum().expand(4)  # a data-dependent shape: no recording can hold it
        return x[:4]

    runner = CudaGraphRunner(uncapturable, warmup=1)
    x = torch.rand(64, device="cuda") + 0.5
    for _ in range(4):
        torch.testing.assert_close(runner(x), x.sum().expand(4))
    assert runner.stats.disabled.startswith("recording failed: ") and "reads a GPU value" in runner.stats.disabled


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_reads_the_capture_branch_makes_only_on_its_first_call_are_not_baked():
    """Transformers' mask helper reads the mask on the host in plain calls and builds a mask tensor under
    capture instead; the first call down that branch compiles the blocks for the new mask, and compiling
    reads values on the host (kopt's first-call checks) once. The retry warms up on the capture branch
    twice and bakes only what the second call reads (here nothing), so the capture matches its log."""
    from kopt.cuda_graphs import CudaGraphRunner

    compiled = []

    def forward(x: torch.Tensor) -> torch.Tensor:
        if not torch.cuda.is_current_stream_capturing():  # plain calls: a host read decides the branch
            return x * 3 if bool((x > -10).all()) else x
        if not compiled:  # the first call on the capture branch "compiles"
            if torch._C._cuda_isCurrentStreamCapturing():
                raise RuntimeError("a recompile while the stream captures")  # as dynamo's would fail
            float(x.sum())  # compiling reads a value on the host, once
            compiled.append(True)
        return x * 3

    runner = CudaGraphRunner(forward, warmup=1)
    x = torch.rand(64, device="cuda") + 0.5
    for _ in range(5):
        torch.testing.assert_close(runner(x), x * 3)
    assert runner.stats.disabled is None, runner.stats.describe()
    assert runner.stats.recorded == 1 and runner.stats.replays >= 2 and runner.stats.baked_reads == 0
