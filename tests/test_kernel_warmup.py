"""A rewritten graph's kopt kernel calls launched side by side before its first run
(``kopt/kernel_warmup.py``): one per distinct call, whole blocks left out, each rebuilt on zero tensors
laid out as the graph gives them; in threads in the caller's modes; within a memory budget; never a
launch that would have to tune first (``known_choices_only``)."""

from __future__ import annotations

import threading

import pytest
import torch

import kopt
from kopt.kernel_warmup import (
    _launch,
    call_bytes,
    kernel_calls,
    launch_side_by_side,
    warm_up_kernels,
    within_memory,
)
from kopt.kernels._autotune import ChoiceUnknown, Tuner, known_choices_only
from kopt.reference import reference_forward
from tests.conftest import rel_err, tiny_with_more_blocks

CPU = torch.device("cpu")


def _rewritten_block_graph() -> torch.fx.GraphModule:
    """Tiny FLUX.2's double block, rewritten by kopt's passes: its graph calls kopt's fused ops."""
    workload, model = tiny_with_more_blocks("flux2", extra=1)
    inputs = workload.inputs("tiny", seed=3)
    compiled = kopt.compile(model, regional=True, lower="eager", progress=False)
    with torch.no_grad():
        compiled(**inputs)
    graphs = [g.captured.graph_module for g in compiled._kopt_backend.compiled if g.captured is not None]
    return max(graphs, key=lambda g: len(kernel_calls(g)))


def test_each_distinct_kernel_call_is_found_once_and_launches_on_zeros():
    graph = _rewritten_block_graph()
    every = [n for n in graph.graph.nodes if n.op == "call_function" and str(n.target).startswith("kopt.")]
    calls = kernel_calls(graph)
    assert all("opaque_block" not in str(n.target) for n in calls)
    assert {str(n.target) for n in calls} == {str(n.target) for n in every}  # every op kept...
    assert 0 < len(calls) < len(every)  # ...and a call identical to an earlier one launched once
    # each call rebuilt from the graph's metadata runs (on the CPU: the op's reference implementation)
    assert all(_launch(node) for node in calls)
    assert all(call_bytes(node) > 0 for node in calls)


def test_launches_run_side_by_side_in_the_callers_modes_and_a_failure_is_left_to_the_run():
    calls = list(range(6))  # stand-ins for nodes: launch() below is given them
    barrier = threading.Barrier(len(calls) - 1, timeout=30)
    seen = []
    caller = threading.current_thread().name

    def launch(call):
        if call != calls[0]:
            barrier.wait()  # returns only if every worker's launch runs at once
        seen.append((call, torch.is_inference_mode_enabled(), threading.current_thread().name))
        return call != calls[-1]  # the last one fails: not counted, left to the graph's run

    with torch.inference_mode():
        launched, workers = launch_side_by_side(calls, CPU, threads=8, launch=launch)
    assert (launched, workers) == (len(calls) - 1, len(calls) - 1)  # one thread per call after the first
    assert sorted(c for c, *_ in seen) == calls and all(inference for _, inference, _ in seen)
    assert seen[0][2] == caller and all(name.startswith("kopt-warmup") for *_, name in seen[1:])


def test_only_calls_within_the_memory_budget_are_launched():
    graph = _rewritten_block_graph()
    calls = kernel_calls(graph)
    sizes = [call_bytes(n) for n in calls]
    assert within_memory(calls, sum(sizes)) == calls
    kept = within_memory(calls, sizes[0])
    assert kept[0] is calls[0] and sum(call_bytes(n) for n in kept) <= sizes[0]
    assert within_memory(calls, 0) == []


def test_off_cuda_nothing_is_launched():
    assert warm_up_kernels(_rewritten_block_graph(), CPU) == 0


def test_a_launch_ahead_never_tunes(tmp_path):
    """Under known_choices_only a key without a choice raises instead of timing; a known one is used."""
    timed = []

    def timer(fn):
        timed.append(fn)
        return 1.0

    tuner = Tuner(path=tmp_path / "a.json", timer=timer, enabled=True)
    candidates = [{"BLOCK": 64}, {"BLOCK": 128}]
    with known_choices_only(), pytest.raises(ChoiceUnknown):
        tuner.choose("k", "n=8", candidates, lambda: (lambda config: None), CPU)
    assert timed == []
    chosen = tuner.choose("k", "n=8", candidates, lambda: (lambda config: None), CPU)  # tunes, outside
    assert len(timed) == 2
    with known_choices_only():
        assert tuner.choose("k", "n=8", candidates, lambda: (lambda config: None), CPU) == chosen
    assert len(timed) == 2
    seen = []
    worker = threading.Thread(target=lambda: seen.append(_known_only_elsewhere()))
    with known_choices_only():
        worker.start()
        worker.join()
    assert seen == [False]  # the setting is the thread's own


def _known_only_elsewhere() -> bool:
    from kopt.kernels._autotune import _KNOWN_ONLY

    return _KNOWN_ONLY.active


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_compile_launches_its_kernels_ahead_and_computes_the_same(caplog):
    """The first compile tunes the tiny shapes' kernels at its first run (nothing known to launch ahead);
    a second compile of the same shapes finds the choices and launches its kernels ahead."""
    device = torch.device("cuda")
    launched = []
    for _ in range(2):
        workload, model = tiny_with_more_blocks("flux2", extra=1)
        model = model.to(device, torch.bfloat16)
        inputs = workload.inputs("tiny", device=device, dtype=torch.bfloat16, seed=5)
        caplog.clear()
        with torch.no_grad():
            exact = reference_forward(model, **inputs)[0]  # float32
            eager = model(**inputs)[0]
            with caplog.at_level("INFO", logger="kopt"):
                got = kopt.compile(model, regional=True, progress=False)(**inputs)[0]
        assert rel_err(got, exact) <= 1.5 * rel_err(eager, exact) + 2 ** -8  # the zoo's bf16 bound
        lines = [r.getMessage() for r in caplog.records if "launched ahead" in r.getMessage()]
        launched.append(sum(int(line.split(": ", 1)[1].split(" of ")[0]) for line in lines))
    assert launched[1] > 0, launched
