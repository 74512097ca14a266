"""Pipeline choices (opt-in / left-out passes, attention backend per shape) through the loop, the KB and
``kopt.compile(passes="auto")``; micro pruning; all on the CPU with the deterministic cost model."""

import json
import shutil

import pytest
import torch

import kopt
from kopt.agent import optimize
from kopt.agent.candidate import Candidate, CandidateKind
from kopt.agent.cost_model import CostModel
from kopt.agent.graphs import capture_graphs
from kopt.agent.kb import KnowledgeBase, Status
from kopt.agent.kb.records import CandidateRecord, Measurement
from kopt.agent.pipeline_choice import (
    PipelineChoice,
    best_accepted,
    from_candidate,
    graph_region,
    output_checks,
    random_args,
    run_choice,
    to_candidate,
)
from kopt.agent.propose.pipeline import attention_choices, base_pipeline, pass_choices
from kopt.agent.sdpa_backend import SDPA_OP
from kopt.passes.base import Contract
from kopt.passes.pipeline import opt_in_passes, with_pass
from kopt.reference import reference_forward
from tests.agent.tiny_models import sigmoid_gelu_mlp, tiny_attention_block


def _rel_err(got: torch.Tensor, reference: torch.Tensor) -> float:
    return float((got.double() - reference).norm() / reference.norm())


def _pass_record(compiled: object, name: str) -> object:
    return next(r for r in compiled.kopt_report.graphs[-1].passes if r.name == name)


def test_search_proposes_each_opt_in_and_each_left_out_pass():
    """One choice per non-FP8 opt-in pass (before staging) and one per default pass but staging."""
    base = base_pipeline()
    changes = {c.change: c for c in pass_choices(base)}
    assert "add codegen-fuse" in changes and changes["add codegen-fuse"].passes[-2:] == ("codegen-fuse", "staging")
    assert {f"drop {n}" for n in base if n != "staging"} <= set(changes)
    assert "drop residual-fp32" in changes and "residual-fp32" not in changes["drop residual-fp32"].passes
    assert not any("fp8" in c for c in changes) and "drop staging" not in changes
    assert {p.name for p in opt_in_passes()} >= {"codegen-fuse"}


def test_attention_backend_choice_is_rewritten_checked_and_costed():
    """The attention node of one shape runs on the math backend via kopt_agent::sdpa: the output stays
    within the contract against the float64 reference on fresh inputs; the cost model charges math more."""
    model, inputs = tiny_attention_block()
    graph = capture_graphs(model, inputs)[0]
    (choice,) = attention_choices(graph.graph_module, base_pipeline(), "cpu")
    assert choice.sdpa[0][1] == "math" and choice.change.startswith("attention q[2, 2, 24, 16]")
    rewritten = run_choice(graph.original, choice)
    assert sum(n.target is SDPA_OP for n in rewritten.graph.nodes) == 1
    checks = output_checks(graph.original, rewritten, random_args(graph.original, seed=3), choice.contract)
    assert checks and all(c["ok"] for c in checks) and 0 < checks[0]["rel_err"] < 1e-5
    cost = CostModel()
    assert cost.graph_s(rewritten) > cost.graph_s(run_choice(graph.original, PipelineChoice(choice.base, choice.base)))


def test_choices_compose_on_what_was_kept():
    """A later change is measured on top of the accepted one: both changes in one pass list."""
    base = base_pipeline()
    changes = {c.change: c for c in pass_choices(base)}
    both = changes["add codegen-fuse"].applied_to(changes["drop bias-absorption"])
    assert "bias-absorption" not in both.passes and both.passes[-2:] == ("codegen-fuse", "staging")
    assert both.on_top_of == "drop bias-absorption" and both.base == base


def _accepted(choice: PipelineChoice, speedup: float, at: float) -> CandidateRecord:
    candidate = to_candidate("a" * 64, choice)
    return CandidateRecord(candidate.to_dict(), candidate.content_hash, "a" * 64, "env", Status.ACCEPTED, "win", None,
                           None, Measurement("speedup", speedup, speedup * 0.99, speedup * 1.01, 20), None, at)


def test_the_best_choice_counts_the_speedups_it_was_measured_on_top_of():
    """A choice kept on top of another was timed against that one: 1.2x on top of 2.0x is 2.4x against the
    base, ahead of the 2.0x alone and of a 2.2x kept on its own; a choice whose predecessor is gone counts
    its own speedup; the order records come in does not matter."""
    base = base_pipeline()
    changes = {c.change: c for c in pass_choices(base)}
    first = changes["add codegen-fuse"]
    on_top = changes["add fuse-attention"].applied_to(first)
    alone = changes["drop bias-absorption"]
    orphan = changes["drop split-concat-linear"].applied_to(changes["drop residual-fp32"])  # its base record is gone
    records = [_accepted(first, 2.0, 1.0), _accepted(on_top, 1.2, 2.0), _accepted(alone, 2.2, 3.0),
               _accepted(orphan, 2.3, 4.0)]
    for order in (records, records[::-1]):
        assert from_candidate(Candidate.from_dict(best_accepted(order).candidate)).change == "add fuse-attention"
    assert from_candidate(Candidate.from_dict(best_accepted(records[:1] + records[2:]).candidate)).change \
        == "drop split-concat-linear"
    assert best_accepted([]) is None


def test_region_variants_no_faster_than_the_kept_one_stop_at_the_micro_step(tmp_path):
    """With region candidates alone, the first kernel wins end to end; each later variant of that region
    is stopped by its region-level time against the kept one (a KB record with a micro measurement and
    no end-to-end one)."""
    model, inputs = sigmoid_gelu_mlp()
    kb_path = tmp_path / "kb.sqlite"
    result = optimize(model, inputs, budget_min=5, kb_path=kb_path, clock="cost-model", seed=0, model_name="mlp",
                      pipelines=False)
    assert result.evaluations[0].status is Status.ACCEPTED
    pruned = [e for e in result.evaluations if e.reason.startswith("micro: not 1% faster")]
    assert pruned == result.evaluations[1:] and all(e.status is Status.SLOWER and e.e2e is None for e in pruned)
    with KnowledgeBase(kb_path) as kb:
        record = next(r for r in kb.candidates() if r.candidate_hash == pruned[0].candidate.content_hash)
        assert record.micro is not None and record.micro.baseline > 0 and record.e2e is None


def test_loop_keeps_pipeline_choices_and_compile_applies_them(tmp_path):
    """The loop evaluates pipeline choices (before any kernel: they are cheap to settle) against the
    whole-model reference and keeps those that win end to end, each measured on top of those kept before
    it; kopt.compile(passes="auto") then runs the best stored pass list for that graph after re-verifying
    it, and a stored choice that cannot be re-verified is not used."""
    model, inputs = sigmoid_gelu_mlp()
    kb_path = tmp_path / "kb.sqlite"
    result = optimize(model, inputs, budget_min=5, kb_path=kb_path, clock="cost-model", seed=0, model_name="mlp")
    choices = [e for e in result.evaluations if e.candidate.kind is CandidateKind.PASS_CHOICE]
    assert result.evaluations[:len(choices)] == choices  # every choice before any kernel
    timed = [e for e in choices if e.e2e is not None]
    unchanged = [e for e in choices if e.reason.startswith("changes nothing")]
    assert len(choices) >= 9 and len(timed) >= 2 and all(e.verdict["kind"] == "whole-model" for e in timed)
    assert len(timed) + len(unchanged) == len(choices)
    kept = [e for e in choices if e.status is Status.ACCEPTED]
    assert kept and all(e.e2e.speedup.ci_low > 1.0 and all(q["ok"] for q in e.e2e.quality) for e in kept)
    change = dict(kept[0].candidate.params)["change"]
    later = choices[choices.index(kept[0]) + 1:]
    assert later and all(dict(e.candidate.params)["on_top_of"].startswith(change) for e in later)
    best = max(kept, key=lambda e: e.e2e.speedup.median)  # what passes="auto" applies
    change = dict(best.candidate.params)["change"]

    fresh = torch.randn(2, 24, 32)
    plain = kopt.compile(model, passes="auto", lower="eager", kb=False, check_lowering=False)
    plain(fresh)
    compiled = kopt.compile(model, passes="auto", lower="eager", kb=kb_path, check_lowering=False)
    out = compiled(fresh)
    select = _pass_record(compiled, "kb-pipeline")
    assert any("re-verified" in n and change in n for n in select.notes)
    verb, name = change.split(" ", 1)
    if verb == "drop":
        assert _pass_record(plain, name).total_matches > 0 and _pass_record(compiled, name).total_matches == 0
    else:
        assert verb == "add" and _pass_record(compiled, name).total_matches > 0
        assert not any(r.name == name for r in plain.kopt_report.graphs[-1].passes)
    # a choice settled as changing nothing drops a pass that never fires here, or adds one that matches nothing
    assert unchanged and all(e.status is Status.SLOWER for e in unchanged)
    for evaluation in unchanged:
        verb, name = dict(evaluation.candidate.params)["change"].split(" ", 1)
        assert verb in ("drop", "add")
        ran = plain
        if verb == "add":
            ran = kopt.compile(model, passes=list(from_candidate(evaluation.candidate).passes), lower="eager",
                               kb=False, check_lowering=False)
            ran(fresh)
        assert _pass_record(ran, name).total_matches == 0
    assert _rel_err(out, reference_forward(model, fresh)) < 1e-5

    kept_passes = from_candidate(best.candidate).passes
    broken = PipelineChoice((*kept_passes[:-1], "codegen-fuse", "staging"), base_pipeline(),
                            options=(("codegen-fuse", json.dumps({"fp8": {"granularity": "no-such-granularity"}})),),
                            change="planted: options the pass cannot take")
    planted = Candidate(best.candidate.region_signature, CandidateKind.PASS_CHOICE, json.dumps(broken.to_dict()),
                        Contract.tolerance(1e-2), entry_point="pipeline", origin="test")
    bad_kb = tmp_path / "bad.sqlite"
    shutil.copy(kb_path, bad_kb)
    with KnowledgeBase(bad_kb) as kb:  # the best stored speedup: the one passes="auto" picks
        kb.record_candidate(planted, status=Status.ACCEPTED, reason="planted: accepted by an older kopt",
                            e2e=Measurement("speedup", 9.0, 8.0, 10.0, 20))
    compiled = kopt.compile(model, passes="auto", lower="eager", kb=bad_kb, check_lowering=False)
    out = compiled(fresh)
    select = _pass_record(compiled, "kb-pipeline")
    assert any("failed re-verification" in m.reason for m in select.near_misses), select.notes
    assert _pass_record(compiled, "bias-absorption").total_matches > 0  # the base list ran
    assert _rel_err(out, reference_forward(model, fresh)) < 1e-5
    with KnowledgeBase(bad_kb) as kb:
        assert kb.latest()[-1].status is Status.REJECTED



def test_fp8_config_gives_one_choice_per_granularity_with_the_config_kept():
    """With an FP8 config, each granularity is a choice whose fp8-linear gets that config (the user's
    skip patterns kept), built again from the JSON the KB stores."""
    from kopt.agent.propose.pipeline import fp8_choices
    from kopt.fp8.config import Fp8Config, Granularity

    config = Fp8Config(skip=("*.proj_out.*",), min_features=64)
    choices = fp8_choices(base_pipeline(), config)
    assert len(choices) == len(Granularity) + 1  # and the config's own granularity with FP8 attention
    for choice in choices:
        rebuilt = PipelineChoice.from_dict(json.loads(json.dumps(choice.to_dict())))
        linear = next(p for p in rebuilt.build() if p.name == "fp8-linear")
        assert linear.config.granularity.value in choice.change and linear.config.skip == ("*.proj_out.*",)
        assert linear.config.min_features == 64 and "staging" == rebuilt.passes[-1]
        assert ("fp8-attention" in rebuilt.passes) == choice.change.endswith("+ fp8 attention")
    attention = [c for c in choices if "fp8-attention" in c.passes]
    assert [c.change for c in attention] == ["fp8 row scales + fp8 attention"]
    assert len(fp8_choices(base_pipeline(), Fp8Config(attention=True))) == len(Granularity)
    row = next(c for c in choices if "row" in c.change)
    assert "fuse-adaln-quant" in row.passes and "residual-fp32" not in row.passes


@pytest.mark.parametrize("repeat_heads", [False, True], ids=["backend-groups", "heads-repeated"])
def test_attention_choice_on_grouped_query_attention_runs_and_matches(monkeypatch, repeat_heads):
    """A Llama block's causal attention reads 2 query heads per key/value head (the captured flash node
    takes them as they are, no broadcast can pair 4 heads with 2); rewritten onto the other backend the
    graph still runs and stays within the contract against the float64 reference, whether the backend
    groups the heads itself or takes them repeated (as cuDNN's and the efficient kernel's choices do)."""
    import kopt.agent.sdpa_backend as sdpa_backend

    transformers = pytest.importorskip("transformers")
    if repeat_heads:
        monkeypatch.setattr(sdpa_backend, "GQA_BACKENDS", ())
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    inputs = dict(input_ids=torch.randint(0, 64, (1, 12)), attention_mask=torch.ones(1, 12, dtype=torch.int64),
                  use_cache=False, return_dict=False)
    graph = capture_graphs(model, inputs, regional=True)[0]
    (choice,) = attention_choices(graph.graph_module, base_pipeline(), "cpu")
    assert choice.sdpa[0][0].startswith("q[1, 4, 12, 16]k[1, 2, 12, 16]")
    rewritten = run_choice(graph.original, choice)
    assert sum(n.target is SDPA_OP for n in rewritten.graph.nodes) == 1
    checks = output_checks(graph.original, rewritten, random_args(graph.original, seed=5), choice.contract)
    assert checks and all(c["ok"] for c in checks) and 0 < checks[0]["rel_err"] < 1e-5


def test_a_choice_measured_before_a_pass_joined_auto_applies_where_that_pass_changes_nothing(tmp_path):
    """A newer kopt adds a pass to "auto": the KB's choices were measured against the older list. Where
    the added pass leaves the graph unchanged, the old and new base run the same rewrites, so the choice
    still applies (its note says so); where it changes the graph, the choice is declined with the reason.
    Planted as an older kopt would have recorded them: base and choice without the added pass."""
    from kopt.agent.auto_pipeline import added_to_base

    model, _ = sigmoid_gelu_mlp()
    fresh = torch.randn(2, 24, 32)
    plain = kopt.compile(model, passes="auto", lower="eager", kb=False, check_lowering=False)
    plain(fresh)
    (graph,) = capture_graphs(model, (fresh,))
    region = graph_region(graph.original)
    signature = region.signature
    base = tuple(base_pipeline())
    assert added_to_base(base[:1] + base[2:], base) == [base[1]] and added_to_base(base, base[1:]) is None
    cases = {"split-concat-linear": True, "bias-absorption": False}  # the added pass: changes nothing here?
    assert _pass_record(plain, "split-concat-linear").total_matches == 0
    assert _pass_record(plain, "bias-absorption").total_matches > 0
    for added, applies in cases.items():
        older = tuple(n for n in base if n != added)
        choice = PipelineChoice(with_pass(older, "codegen-fuse"), older, change="add codegen-fuse")
        planted = Candidate(signature, CandidateKind.PASS_CHOICE, json.dumps(choice.to_dict()),
                            Contract.tolerance(1e-2), entry_point="pipeline", origin="test")
        kb_path = tmp_path / f"older-{added}.sqlite"
        with KnowledgeBase(kb_path) as kb:
            kb.record_region(region, model="mlp")
            kb.record_candidate(planted, status=Status.ACCEPTED, reason="planted: accepted by an older kopt",
                                e2e=Measurement("speedup", 1.2, 1.1, 1.3, 20))
        compiled = kopt.compile(model, passes="auto", lower="eager", kb=kb_path, check_lowering=False)
        out = compiled(fresh)
        select = _pass_record(compiled, "kb-pipeline")
        if applies:
            assert any("re-verified" in n and f"measured before {added} joined" in n for n in select.notes), select
            assert _pass_record(compiled, "codegen-fuse").total_matches > 0  # the choice ran
        else:
            assert any(f"before {added} joined the base list" in m.reason for m in select.near_misses), select
            assert _pass_record(compiled, "bias-absorption").total_matches > 0  # the base list ran
            assert _pass_record(compiled, "codegen-fuse").total_matches == 0
        assert _rel_err(out, reference_forward(model, fresh)) < 1e-5
