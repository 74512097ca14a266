"""The end-to-end clock can time what users get: the graphs lowered by Inductor (CPU here, C++)."""

import pytest
import torch

from kopt.agent.bench import WallClock, applied
from kopt.agent.graphs import capture_graphs
from kopt.agent.propose.pipeline import propose_pipelines
from tests.agent.tiny_models import tiny_attention_block


def test_wall_clock_lowers_with_inductor_including_a_pipeline_choice():
    """With lower="inductor" the timed callables are Inductor's compiled graphs (not FX modules); with an
    attention-backend choice applied (the kopt_agent::sdpa op lowers as an extern kernel) the lowered
    output matches the FX graph's on the captured inputs."""
    model, inputs = tiny_attention_block()
    graphs = capture_graphs(model, inputs)
    choice = next(c for c in propose_pipelines(graphs) if "attention" in dict(c.params)["change"])
    chosen = {choice.region_signature: choice}
    clock = WallClock(graphs, lower="inductor")
    assert clock.name == "wall-inductor"
    samples = clock.samples(chosen, 3, 0)
    assert len(samples) == 3 and all(s > 0 for s in samples)
    (lowered,) = clock._modules(chosen)
    assert not isinstance(lowered, torch.fx.GraphModule)
    (fx_module,) = applied(graphs, chosen)
    with torch.no_grad():
        got, expected = lowered(*graphs[0].args), fx_module(*graphs[0].args)
    got, expected = got[0] if isinstance(got, (tuple, list)) else got, expected[0]
    assert float((got - expected).norm() / expected.norm()) < 1e-5


def test_the_baseline_is_built_once_across_candidates(monkeypatch):
    """Each built candidate set costs a whole-model lowering on a GPU: across two candidates' A/B
    runs the baseline A is built once, each B once."""
    import kopt.agent.bench as bench

    model, inputs = tiny_attention_block()
    graphs = capture_graphs(model, inputs)
    first, second = [c for c in propose_pipelines(graphs) if "drop" in dict(c.params)["change"]][:2]
    built = []
    real_applied = bench.applied
    monkeypatch.setattr(bench, "applied", lambda gs, chosen: built.append(tuple(chosen)) or real_applied(gs, chosen))
    clock = WallClock(graphs)
    for candidate in (first, second):
        a, b = bench.interleaved(clock, {}, {candidate.region_signature: candidate}, 4)
        assert len(a) == len(b) == 4
    assert built == [(), (first.region_signature,), (second.region_signature,)]


def test_replay_is_off_on_the_cpu_and_cannot_be_forced_there():
    """CUDA-graph replay of the A/B sides is a GPU matter: off by default on the CPU, an error when asked."""
    model, inputs = tiny_attention_block()
    graphs = capture_graphs(model, inputs)
    assert WallClock(graphs, lower="inductor").replay is False
    with pytest.raises(ValueError, match="CUDA device"):
        WallClock(graphs, lower="inductor", replay=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_a_b_replays_each_side_from_a_cuda_graph():
    """On a GPU the lowered graphs of each side are recorded once and replayed per sample (what
    kopt.compile users get)."""
    model, inputs = tiny_attention_block()
    model, inputs = model.cuda(), tuple(x.cuda() for x in inputs)
    graphs = capture_graphs(model, inputs)
    clock = WallClock(graphs, lower="inductor")
    assert clock.replay and clock.name == "wall-inductor-graphs"
    samples = clock.samples({}, 3, 0)
    assert len(samples) == 3 and all(s > 0 for s in samples)
    runner = clock._runners[()]
    assert runner.stats.recorded == 1 and runner.stats.disabled is None and not clock.unreplayed
    from kopt.agent.bench import _run_all
    from kopt.cuda_graphs import replay_mismatch

    replayed = runner()  # the recording's outputs after one more replay
    assert runner.stats.replays >= 4
    assert replay_mismatch(replayed, _run_all(clock._modules({}), graphs)) is None
