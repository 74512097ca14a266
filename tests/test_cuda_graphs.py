"""CUDA-graph replay of lowered graphs: when it is used, when it is not (and says why), and on a GPU
that replays compute what plain calls compute, for fresh inputs, with outputs that stay valid."""

from __future__ import annotations

import pytest
import torch

import kopt
from kopt.config import CompileOptions, Lowering
from kopt.cuda_graphs import CudaGraphRunner
from tests.conftest import rel_err
from tests.kernels.fp8_checks import assert_fp8_matches

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_default_is_on_for_inductor_and_off_for_eager():
    assert CompileOptions().use_cuda_graphs
    assert not CompileOptions(lower=Lowering.EAGER).use_cuda_graphs
    assert not CompileOptions(cuda_graphs=False).use_cuda_graphs


def test_cpu_inputs_run_plainly_and_say_why():
    calls = []
    runner = CudaGraphRunner(lambda x, k: calls.append(k) or x * k, warmup=0)
    x = torch.randn(3)
    assert torch.equal(runner(x, 2), x * 2)
    assert calls == [2] and runner.stats.recorded == 0 and runner.stats.plain_calls == 1
    assert "not a CUDA device" in runner.stats.skipped
    assert "not a CUDA device" in runner.stats.describe()


def test_cpu_compile_records_no_graphs(tiny_dit):
    _, model, inputs = tiny_dit
    compiled = kopt.compile(model, lower="eager")
    with torch.no_grad():
        compiled(**inputs)
    assert all(graph.cuda_graphs is None for graph in compiled.kopt_report.graphs)


@pytest.mark.gpu
@needs_cuda
def test_replays_match_plain_calls_on_fresh_inputs_and_outputs_stay_valid():
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).cuda()
    runner = CudaGraphRunner(lambda x, scale: layer(x) * scale)
    with torch.no_grad():
        outputs, expected = [], []
        for step in range(5):
            x = torch.randn(32, 64, device="cuda") * (step + 1)
            outputs.append(runner(x, 0.5))
            expected.append(layer(x) * 0.5)
        for out, ref in zip(outputs, expected, strict=True):  # earlier outputs were not overwritten by later replays
            assert rel_err(out, ref) < 1e-5
        assert runner.stats.recorded == 1 and runner.stats.replays == 4  # call 1 warms up, call 2 records and replays
        runner(torch.randn(8, 64, device="cuda"), 0.5)  # a new shape: warmed up, then recorded on its next call
        assert "warming up" in runner.stats.skipped
        runner(torch.randn(8, 64, device="cuda"), 0.5)
        assert runner.stats.recorded == 2


@pytest.mark.gpu
@needs_cuda
def test_a_failed_recording_leaves_random_ops_and_later_recordings_working():
    """A capture that raises leaves torch's random generator in capture mode: every random op of the
    process outside a capture then fails ("Offset increment outside graph capture"). The runner takes
    it out again, and records other functions after."""
    def uncapturable(x):
        return x + torch.tensor([0.5, 2.0], device=x.device)[0]  # a pageable host copy: capture refuses it

    runner = CudaGraphRunner(uncapturable, warmup=1)
    x = torch.randn(64, device="cuda")
    for _ in range(4):
        assert rel_err(runner(x), x.double() + 0.5) < 1e-6
    assert runner.stats.recorded == 0 and runner.stats.disabled is not None
    noise = torch.randn(1024, device="cuda")  # raised before the generator was put back
    assert 0.5 < noise.std().item() < 1.5
    other = CudaGraphRunner(lambda t: t * 3 + torch.rand_like(t) * 0, warmup=1)
    for _ in range(3):
        y = torch.randn(64, device="cuda")
        assert rel_err(other(y), y.double() * 3) < 1e-6
    assert other.stats.recorded == 1 and other.stats.replays >= 1


@pytest.mark.gpu
@needs_cuda
def test_kopt_compile_replays_a_tiny_dit_exactly_like_plain_launches(tiny_dit):
    workload, model, _ = tiny_dit
    model = model.cuda()
    graphed = kopt.compile(model)
    plain = kopt.compile(model, cuda_graphs=False)
    with torch.no_grad():
        for seed in (1, 2, 3):
            inputs = {k: v.cuda() if isinstance(v, torch.Tensor) else v
                      for k, v in workload.inputs("tiny", seed=seed).items()}
            out = graphed(**inputs)[0]
            assert rel_err(out, plain(**inputs)[0]) < 1e-4  # two separate Inductor compiles
            assert rel_err(out, model(**inputs)[0]) < 2e-2
    stats = [g.cuda_graphs for g in graphed.kopt_report.graphs if g.cuda_graphs is not None]
    assert stats and all(s.disabled is None and s.replays >= 1 for s in stats)
    assert "CUDA graphs:" in str(graphed.kopt_report)


@pytest.mark.gpu
@needs_cuda
def test_a_kernel_recorded_into_a_graph_runs_the_config_its_warm_up_tuned(tmp_path, monkeypatch):
    """The warm-up call tunes (here: a forced non-default winner); the recorded launch must use that
    choice, although nothing can be timed during capture (it used to fall back to the default)."""
    from kopt.kernels import _autotune, activation_quant

    class PreferChunks(_autotune.Tuner):
        def _tune(self, kernel, key, candidates, run):
            return next(c for c in candidates if c.get("IN_REGISTERS")), {}

    monkeypatch.setattr(_autotune, "TUNER", PreferChunks(path=tmp_path / "autotune.json", enabled=True))
    h = torch.randn(64, 12288, device="cuda", dtype=torch.bfloat16)
    runner = CudaGraphRunner(lambda x: torch.ops.kopt.activation_quant(x, None, "gelu_tanh"))
    eager = runner(h)  # warm-up: tunes
    replayed = runner(h)  # recorded, then replayed
    choice = _autotune.TUNER.last["activation_quant"]
    assert choice.config.get("IN_REGISTERS") and choice.source == "cache", choice
    assert runner.stats.recorded == 1
    assert torch.equal(replayed[0].float(), eager[0].float()) and torch.equal(replayed[1], eager[1])
    q_ref, scale_ref = activation_quant.reference(h, None, "gelu_tanh")  # and both are the op's value
    assert_fp8_matches(replayed[0], replayed[1], q_ref, scale_ref, exact=False)


@pytest.mark.gpu
@needs_cuda
def test_replays_read_weights_where_they_are_and_follow_any_write_to_them():
    """Weights are recorded in place, not copied: a write through ``.data`` to a weight read live, or
    to one behind a merged (derived) weight, is what the next replay computes with; a weight given new
    storage is recorded as a signature of its own."""
    from tests.test_weights import Siblings

    torch.manual_seed(0)
    model = Siblings().cuda().eval()
    compiled = kopt.compile(model, cuda_graphs=True)
    x = torch.randn(4, 16, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            assert rel_err(compiled(x), model(x)) < 1e-5
        stats = compiled.kopt_report.graphs[0].cuda_graphs
        assert stats.recorded == 1 and stats.replays >= 1
        model.out.weight.data.copy_(torch.randn(16, 16, device="cuda"))  # read live
        model.q.weight.data.copy_(torch.randn(16, 16, device="cuda"))  # behind the merged Q/K weight
        assert rel_err(compiled(x), model(x)) < 1e-5
        replays = stats.replays
        model.out.weight.data = torch.randn(16, 16, device="cuda")  # new storage
        for _ in range(3):  # warm-up, record, replay
            assert rel_err(compiled(x), model(x)) < 1e-5
        assert stats.replays > replays and stats.recorded == 2  # the new address: a signature of its own


@pytest.mark.gpu
@needs_cuda
def test_a_bypassing_memo_replays_both_stages_from_one_graph(tiny_dit):
    """A new timestep every call: after the memo's probing misses, the two stages replay as one
    recording (sharing the per-call stage's memory pool and counters), with the plain outputs."""
    workload, model, _ = tiny_dit
    model = model.cuda()
    graphed = kopt.compile(model)
    plain = kopt.compile(model, cuda_graphs=False)
    with torch.no_grad():
        for seed in range(1, 10):
            inputs = {k: v.cuda() if isinstance(v, torch.Tensor) else v
                      for k, v in workload.inputs("tiny", seed=seed).items()}
            inputs[workload.timestep_arg] = inputs[workload.timestep_arg] * (0.5 + seed / 20)  # a new step
            assert rel_err(graphed(**inputs)[0], plain(**inputs)[0]) < 1e-4
    staged = [g for g in graphed.kopt_report.graphs if g.memo is not None]
    assert staged and all(g.memo.bypassed >= 3 for g in staged)
    assert all(g.cuda_graphs.disabled is None and g.cuda_graphs.recorded >= 2 for g in staged)


def test_a_replay_must_compute_what_the_plain_call_computed():
    """:func:`replay_mismatch`, the check a recording passes before it is used (same structure,
    shapes, dtypes, NaN/Inf positions; floating values within 1e-3 relative error)."""
    from kopt.cuda_graphs import replay_mismatch

    x = torch.randn(64, 32)
    plain = (x, torch.arange(4), None)
    assert replay_mismatch((x.clone(), torch.arange(4), None), plain) is None
    assert replay_mismatch((x * (1 + 1e-5), torch.arange(4), None), plain) is None  # reduction order
    assert "relative error" in replay_mismatch((x * 1.01, torch.arange(4), None), plain)
    assert "differs" in replay_mismatch((x, torch.arange(4) + 1, None), plain)
    assert "structure" in replay_mismatch((x, torch.arange(4)), plain)
    assert "bfloat16" in replay_mismatch((x.bfloat16(), torch.arange(4), None), plain)
    stale = x.clone()
    stale[3, 5] = float("nan")
    assert "NaN" in replay_mismatch((stale, torch.arange(4), None), plain)
    assert "relative error" in replay_mismatch((torch.zeros_like(x), torch.arange(4), None), plain)
    q = torch.randn(64).to(torch.float8_e4m3fn)  # FP8 outputs (an activation quantizer's) are compared too
    assert replay_mismatch((q.clone(),), (q,)) is None
    assert "relative error" in replay_mismatch(((q.float() * 2).to(torch.float8_e4m3fn),), (q,))


@pytest.mark.gpu
@needs_cuda
def test_recordings_that_differ_only_in_weights_share_input_buffers_and_stay_exact():
    """One graph called with three blocks' weights (regional compilation without a whole-forward
    replay): three recordings, one set of input buffers, and alternating calls on fresh inputs each
    compute what their own block computes, as a chain of blocks would call them."""
    torch.manual_seed(0)
    weights = [torch.randn(256, 256, device="cuda") / 16 for _ in range(3)]

    def block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w) + x

    runner = CudaGraphRunner(block, static_inputs=(1,), warmup=1, max_graphs=8)
    for _ in range(4):
        x = torch.randn(64, 256, device="cuda")
        h = x
        for w in weights:
            h = runner(h, w)
        expected = x
        for w in weights:
            expected = block(expected, w)
        assert rel_err(h, expected) < 1e-5
    assert runner.stats.recorded == 3 and runner.stats.replays >= 3
    buffers = {id(r.inputs[0]) for r in runner._graphs.values()}
    assert len(buffers) == 1
    unshared = CudaGraphRunner(block, static_inputs=(1,), warmup=0, clone_outputs=False)
    for w in weights[:2]:
        unshared(torch.randn(64, 256, device="cuda"), w)
    assert len({id(r.inputs[0]) for r in unshared._graphs.values()}) == 2  # a returned output may alias one
