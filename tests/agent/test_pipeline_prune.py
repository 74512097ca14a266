"""Pipeline choices settled before the end-to-end A/B: one that leaves the graph as the baseline makes it
(kopt.agent.unchanged), and an attention backend timed alone at its shape (kopt.agent.sdpa_micro)."""

import dataclasses

import pytest
import torch

from kopt.agent.bench import applied_one
from kopt.agent.graphs import capture_graphs
from kopt.agent.micro import MicroBench
from kopt.agent.pipeline_choice import PipelineChoice, structural_copy, to_candidate
from kopt.agent.propose.pipeline import attention_choices, base_pipeline, pass_choices
from kopt.agent.sdpa_backend import SDPA_OP
from kopt.agent.sdpa_micro import attention_inputs, check_attention_choice
from kopt.agent.unchanged import changes_nothing, same_graph
from tests.agent.tiny_models import sigmoid_gelu_mlp, tiny_attention_block


@dataclasses.dataclass
class _Wall:
    """A clock that is not the cost model (the attention micro only runs under real timing)."""

    name: str = "wall"


def _choice_candidate(graph, change: str):
    choices = {c.change: c for c in pass_choices(base_pipeline())}
    return to_candidate(graph.signature, choices[change])


def test_same_graph_needs_the_same_code_and_equal_constants():
    model, inputs = sigmoid_gelu_mlp()
    graph = capture_graphs(model, inputs)[0]
    copy = structural_copy(graph.graph_module)
    assert same_graph(graph.graph_module, copy)  # shared storage
    targets = [n.target for n in copy.graph.nodes if n.op == "get_attr"]
    assert targets
    name = targets[0]
    holder = copy
    for part in name.split(".")[:-1]:
        holder = getattr(holder, part)
    leaf = name.split(".")[-1]
    original = getattr(holder, leaf)
    wrap = torch.nn.Parameter if isinstance(original, torch.nn.Parameter) else (lambda t, requires_grad: t)
    # new storage, equal values: still the same
    setattr(holder, leaf, wrap(original.detach().clone(), requires_grad=False))
    assert same_graph(graph.graph_module, copy)
    changed = original.detach().clone()
    changed.view(-1)[0] += 1.0
    setattr(holder, leaf, wrap(changed, requires_grad=False))  # one value differs: not the same
    assert not same_graph(graph.graph_module, copy)
    assert not same_graph(graph.graph_module, graph.original)  # the passes changed the code


def test_a_choice_that_fires_is_timed_one_that_does_not_is_settled():
    """``drop bias-absorption`` changes the tiny MLP's graph (the pass fires there); ``drop
    fuse-qk-norm-rope`` cannot (no attention in it), so it is settled without timing."""
    model, inputs = sigmoid_gelu_mlp()
    graph = capture_graphs(model, inputs)[0]
    fires = _choice_candidate(graph, "drop bias-absorption")
    idle = _choice_candidate(graph, "drop fuse-qk-norm-rope")
    assert changes_nothing([graph], {}, fires) == ""
    assert list(graph.choice_graphs) == [fires.content_hash]  # its rewrite stays cached for the A/B
    reason = changes_nothing([graph], {}, idle)
    assert reason.startswith("changes nothing") and "drop fuse-qk-norm-rope" in reason


def test_attention_micro_times_both_backends_at_the_node_shape():
    model, inputs = tiny_attention_block(width=64, seq=96)
    graph = capture_graphs(model, inputs)[0]
    (choice,) = attention_choices(graph.graph_module, base_pipeline(), "cpu")
    candidate = to_candidate(graph.signature, choice)
    node = next(n for n in graph.graph_module.graph.nodes if n.op == "call_function"
                and "attention" in str(n.target))
    q, k, v, _, _, _ = attention_inputs(node, torch.device("cpu"), seed=1)
    expected = node.args[0].meta["val"]
    assert q.shape == expected.shape and q.stride() == expected.stride() and q.dtype == expected.dtype
    assert v.shape == node.args[2].meta["val"].shape
    assert q.std() > 0.5 and not torch.equal(q, k)  # fresh random inputs, not zeros

    bench = MicroBench(_Wall(), min_gain=0.01)
    result = check_attention_choice(candidate, [graph], {}, bench)
    assert result is not None and result.measurement is not None
    assert result.measurement.median > 0 and result.measurement.baseline > 0 and result.measurement.samples == 20
    assert "attention q[" in result.reason

    # Amdahl: against a model call of an hour, no attention node can move it by 1%
    bench.saw_model_call(3600.0)
    bounded = check_attention_choice(candidate, [graph], {}, bench)
    assert not bounded.passed
    assert "Amdahl" in bounded.reason or "not 1% faster" in bounded.reason


def test_the_attention_bound_counts_every_block_that_runs_the_graph(monkeypatch):
    """A block graph runs once per block of its class: on Llama its one attention is 32 per model
    call, and the Amdahl bound counts all of them (it counted one and settled a backend that could
    save 4 ms of a 65 ms call as unable to reach 1%). The two backends' times are fixed here: the
    bound's arithmetic is what is tested, not the CPU's attention kernels."""
    import kopt.agent.sdpa_micro as sdpa_micro

    model, inputs = tiny_attention_block(width=64, seq=96)
    graph = capture_graphs(model, inputs)[0]
    (choice,) = attention_choices(graph.graph_module, base_pipeline(), "cpu")
    candidate = to_candidate(graph.signature, choice)
    monkeypatch.setattr(sdpa_micro, "time_backends", lambda *a, **k: ([1.0] * 20, [0.5] * 20))
    bench = MicroBench(_Wall(), min_gain=0.01)
    bench.saw_model_call(0.1)  # 100 ms: one occurrence saving 0.5 ms is 0.5 %, 32 of them 16 %
    graph.calls = 1
    alone = check_attention_choice(candidate, [graph], {}, bench)
    assert not alone.passed and "1 occurrence(s)" in alone.reason
    graph.calls = 32
    per_block = check_attention_choice(candidate, [graph], {}, bench)
    assert per_block.passed and "32 occurrence(s)" in per_block.reason


def test_attention_micro_settles_a_backend_that_cannot_run_the_shape():
    """cuDNN attention has no CPU kernel: the choice is settled as unable to run, with no time."""
    model, inputs = tiny_attention_block()
    graph = capture_graphs(model, inputs)[0]
    (choice,) = attention_choices(graph.graph_module, base_pipeline(), "cpu")
    on_cudnn = dataclasses.replace(choice, sdpa=((choice.sdpa[0][0], "cudnn"),), change="attention on cudnn")
    result = check_attention_choice(to_candidate(graph.signature, on_cudnn), [graph], {}, MicroBench(_Wall()))
    assert result is not None and not result.passed and result.measurement is None
    assert "cannot run on cudnn" in result.reason


def test_the_cost_model_and_other_choices_skip_the_attention_micro():
    model, inputs = tiny_attention_block()
    graph = capture_graphs(model, inputs)[0]
    (choice,) = attention_choices(graph.graph_module, base_pipeline(), "cpu")
    candidate = to_candidate(graph.signature, choice)
    assert check_attention_choice(candidate, [graph], {}, MicroBench(_Wall(name="cost-model"))) is None
    plain = to_candidate(graph.signature, PipelineChoice(choice.base, choice.base, change="nothing"))
    assert check_attention_choice(plain, [graph], {}, MicroBench(_Wall())) is None
    assert any(n.target is SDPA_OP for n in applied_one(graph, {candidate.region_signature: candidate}).graph.nodes)


def test_kb_show_prints_a_pipeline_choice_verdict(tmp_path, capsys):
    """``kopt kb show`` on pipeline-choice records: the model-output checks of a timed one, and the
    reason of one settled as changing nothing (neither carries a sandbox verdict)."""
    from kopt.agent import optimize
    from kopt.agent.kb import KnowledgeBase
    from kopt.cli import main

    model, inputs = sigmoid_gelu_mlp()
    kb_path = tmp_path / "kb.sqlite"
    result = optimize(model, inputs, budget_min=5, kb_path=kb_path, clock="cost-model", seed=0, model_name="mlp",
                      max_candidates=6)
    choices = [e for e in result.evaluations if e.candidate.kind.value == "pass-choice"]
    timed = next(e for e in choices if e.e2e is not None)
    settled = next(e for e in choices if e.reason.startswith("changes nothing"))
    with KnowledgeBase(kb_path) as kb:
        hashes = {r.candidate_hash: r.record_hash for r in kb.candidates()}
    capsys.readouterr()
    assert main(["kb", "--kb", str(kb_path), "show", hashes[timed.candidate.content_hash][:12]]) == 0
    shown = capsys.readouterr().out
    assert "whole-model" in shown and "cosine" in shown and "model outputs within the contract" in shown
    assert main(["kb", "--kb", str(kb_path), "show", hashes[settled.candidate.content_hash][:12]]) == 0
    assert "unchanged-graph: changes nothing" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_attention_micro_on_the_gpu_times_each_backend_the_device_offers():
    """On CUDA, every other backend proposed for a bf16 attention is either timed (a measurement with
    both medians) or settled as unable to run; none raises."""
    model, inputs = tiny_attention_block(width=128, seq=1024)
    model = model.to("cuda", torch.bfloat16)
    graph = capture_graphs(model, tuple(t.to("cuda", torch.bfloat16) for t in inputs))[0]
    choices = attention_choices(graph.graph_module, base_pipeline(), "cuda")
    assert choices
    for choice in choices:
        result = check_attention_choice(to_candidate(graph.signature, choice), [graph], {}, MicroBench(_Wall()))
        assert result is not None
        assert (result.measurement is not None and result.measurement.median > 0) or "cannot run" in result.reason
