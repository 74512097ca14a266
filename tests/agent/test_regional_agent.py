"""The agent working regionally: one graph per block class, timed as the whole forward compiled
regionally with the candidates applied where ``kopt.compile(regional=True)`` applies them."""

import dataclasses

import pytest
import torch

from kopt.agent import optimize
from kopt.agent.candidate import Candidate, CandidateKind
from kopt.agent.cost_model import CostModel
from kopt.agent.graphs import capture_graphs
from kopt.agent.kb import Status
from kopt.agent.profile import find_occurrences
from kopt.agent.regional_clock import RegionalClock
from kopt.passes.base import Contract
from kopt.reference import reference_forward
from tests.agent.tiny_models import sigmoid_gelu_mlp, tiny_block_stack

# the block's gated MLP activation, up * sigmoid(1.702 up) * silu(gate), written as other ops
GATED_SOURCE = """
import torch


def candidate({first}, {second}):
    return (up * torch.sigmoid(up * 1.702) * (gate / (1 + torch.exp(-gate))),)
"""


def _rel_err(got: torch.Tensor, reference: torch.Tensor) -> float:
    return float((got.double() - reference).norm() / reference.norm())


def test_regional_capture_is_one_graph_per_block_class_run_once_per_block():
    model, inputs = tiny_block_stack()
    whole = capture_graphs(model, inputs)
    regional = capture_graphs(model, inputs, regional=True)
    assert [g.calls for g in whole] == [1]
    assert len(regional) == 1 and regional[0].calls == len(model.blocks)
    assert all(getattr(b, "_compiled_call_impl", None) is None for b in model.blocks)  # given back uncompiled
    # the block graph is the block alone: the embedding and the final norm are not in it
    block_nodes = len(regional[0].graph_module.graph.nodes)
    assert block_nodes < len(whole[0].graph_module.graph.nodes) / 2
    # every region of the whole model's graph (but the code between blocks) occurs once per block
    whole_regions = {o.region.signature for o in find_occurrences(whole[0].graph_module)}
    block_regions = [o.region.signature for o in find_occurrences(regional[0].graph_module)]
    assert set(block_regions) <= whole_regions and block_regions
    # the cost model weights the block graph by its calls: the model's time but the code between blocks
    cost = CostModel()
    per_block = cost.graph_s(regional[0].graph_module)
    assert cost.model_s(regional, [], {}) == pytest.approx(3 * per_block)
    assert 3 * per_block < cost.graph_s(whole[0].graph_module)


def _gated_candidate(model, inputs) -> tuple[Candidate, str]:
    graphs = capture_graphs(model, inputs, regional=True)
    for occurrence in find_occurrences(graphs[0].graph_module):
        region = occurrence.region
        targets = {str(n.target) for n in occurrence.members}
        if "aten.silu.default" in targets and "aten.sigmoid.default" in targets:
            # the canonical inputs' order: the one the sigmoid reads is the up projection
            first = "up" if any("sigmoid" in str(u.target) for u in region.input_nodes[0].users) else "gate"
            source = GATED_SOURCE.format(first=first, second="gate" if first == "up" else "up")
            return Candidate(region.signature, CandidateKind.TRITON_KERNEL, source, Contract.tolerance(1e-5),
                             origin="test"), region.signature
    raise AssertionError("the block's gated MLP region was not found")


def test_regional_clock_runs_the_whole_forward_with_the_candidate_in_every_block():
    model, inputs = tiny_block_stack()
    candidate, signature = _gated_candidate(model, inputs)
    clock = RegionalClock(model, inputs, lower="eager")
    assert clock.name == "wall-regional-eager" and not clock.replay
    try:
        seconds = clock.samples({signature: candidate}, 2, 0)
        assert len(seconds) == 2 and all(s > 0 for s in seconds)
        report = clock.report({signature: candidate})
        notes = [n for g in report.graphs for p in g.passes for n in getattr(p, "notes", [])]
        assert any("1 region occurrence(s) replaced" in n for n in notes), notes  # the one block graph
        clock.samples({}, 1, 1)  # the baseline side, then the candidate's again: each keeps its own blocks
        fresh = torch.randn(2, 24, 32)
        side = clock._side({signature: candidate})
        side.activate()
        with torch.no_grad():
            got = side.compiled(fresh)
        assert len(report.graphs) == 1  # one block graph served the three blocks
    finally:
        clock.close()
    reference = reference_forward(model, fresh)
    assert _rel_err(got, reference) < 1e-5
    assert all(getattr(b, "_compiled_call_impl", None) is None for b in model.blocks)


def test_optimize_regionally_measures_candidates_on_the_whole_forward(tmp_path):
    model, inputs = tiny_block_stack()
    result = optimize(model, inputs, budget_min=5, kb_path=tmp_path / "kb.sqlite", regional=True, lower="eager",
                      max_candidates=3, micro=False, seed=0, model_name="stack", progress=False, workers=1)
    assert result.clock.name == "wall-regional-eager"
    assert len(result.graphs) == 1 and result.graphs[0].calls == 3
    timed = [e for e in result.evaluations if e.e2e is not None]
    assert timed and all(e.e2e.clock == "wall-regional-eager" and e.e2e.speedup.samples == 20 for e in timed)
    # each timed candidate was also judged on the model's output, not only on the block graph's
    assert all(any(q["graph"] == "model" for q in e.e2e.quality) for e in timed)
    assert all(e.status in (Status.ACCEPTED, Status.SLOWER, Status.REJECTED, Status.ERROR)
               for e in result.evaluations)
    assert not [e for e in result.evaluations if e.status is Status.ERROR], [e.reason for e in result.evaluations]
    # the profile counts each block's regions once per block
    assert all(r.occurrences % 3 == 0 for r in result.profile.regions)
    assert all(getattr(b, "_compiled_call_impl", None) is None for b in model.blocks)


def test_regional_needs_repeated_blocks():
    model, inputs = sigmoid_gelu_mlp()
    with pytest.raises(ValueError, match="no nn.ModuleList of blocks"):
        optimize(model, inputs, regional=True, clock="cost-model", max_candidates=1)


def test_a_region_candidate_whose_region_an_accepted_choice_rewrote_is_settled_untimed():
    """After a pipeline choice fused the block's elementwise regions, a candidate for one of them has
    nothing left to replace: it is settled as changing nothing, before the sandbox and the A/B."""
    from kopt.agent.bench import BenchConfig
    from kopt.agent.loop import evaluate
    from kopt.agent.propose.pipeline import propose_pipelines
    from kopt.agent.unchanged import changes_nothing
    from kopt.agent.verify import VerifyConfig

    model, inputs = tiny_block_stack()
    graphs = capture_graphs(model, inputs, regional=True)
    candidate, _ = _gated_candidate(model, inputs)
    assert changes_nothing(graphs, {}, candidate) == ""  # on the baseline's graph it replaces the region
    fuse = next(c for c in propose_pipelines(graphs) if dict(c.params).get("change") == "add codegen-fuse")
    accepted = {fuse.region_signature: fuse}
    reason = changes_nothing(graphs, accepted, candidate)
    assert "occurs nowhere" in reason and "add codegen-fuse" in reason

    class NoClock:  # the A/B must not run
        name = "unused"

        def samples(self, *args):
            raise AssertionError("timed a candidate that changes nothing")

    evaluation = evaluate(candidate, None, graphs, accepted, NoClock(), VerifyConfig(), BenchConfig())
    assert evaluation.status is Status.SLOWER and evaluation.reason == reason and evaluation.e2e is None


def test_the_model_output_check_sees_an_error_every_block_repeats():
    """A candidate a little off (1.70 for 1.702) in every block: the model's output against its float64
    reference, within a 1e-5 contract, fails; the faithful candidate passes."""
    model, inputs = tiny_block_stack()
    candidate, signature = _gated_candidate(model, inputs)
    off = dataclasses.replace(candidate, source=candidate.source.replace("1.702", "1.70"))
    clock = RegionalClock(model, inputs, lower="eager")
    try:
        good = clock.model_checks({signature: candidate}, Contract.tolerance(1e-5), seed=3)
        bad = clock.model_checks({signature: off}, Contract.tolerance(1e-5), seed=3)
    finally:
        clock.close()
    assert good and all(c["ok"] and c["graph"] == "model" for c in good)
    assert bad and not any(c["ok"] for c in bad) and bad[0]["rel_err"] > 1e-5


def test_a_side_whose_candidate_breaks_its_pass_is_an_error_not_a_timing(monkeypatch):
    """kopt.compile skips a pass that raises (the user's model keeps running); the clock refuses to
    time such a side, since it would time the baseline under the candidate's name."""
    import kopt.agent.regional_clock as regional_clock
    from kopt.passes.base import Pass

    class Broken(Pass):
        name = "broken"
        why = "raises, as a buggy rule would"
        contract = Contract.exact()

        def apply(self, graph_module, ctx):
            raise RuntimeError("bug in the rule")

    model, inputs = tiny_block_stack()
    clock = RegionalClock(model, inputs, lower="eager")
    original = regional_clock.side_passes
    monkeypatch.setattr(regional_clock, "side_passes", lambda chosen: [*original(chosen), Broken()])
    try:
        with pytest.raises(RuntimeError, match="skipped pass 'broken'.*bug in the rule"):
            clock.samples({}, 1, 0)
    finally:
        clock.close()
    assert all(getattr(b, "_compiled_call_impl", None) is None for b in model.blocks)


def test_regions_an_accepted_fp8_choice_makes_get_proposals_of_their_own(tmp_path):
    """Under an FP8 pipeline the block has activation-quantize regions it did not have in bf16: they are
    found, and once the first batch is taken, the next batch proposes kernels for them (and only them)."""
    from kopt.agent.kb import KnowledgeBase
    from kopt.agent.loop import _proposal_batches, regions_under_accepted
    from kopt.agent.profile import profile_graphs
    from kopt.agent.propose.pipeline import propose_pipelines
    from kopt.fp8.config import Fp8Config

    model, inputs = tiny_block_stack()
    graphs = capture_graphs(model, inputs, regional=True)
    occurrences = find_occurrences(graphs[0].graph_module)
    known = {o.region.signature: o.region for o in occurrences}
    fp8 = next(c for c in propose_pipelines(graphs, fp8=Fp8Config(min_features=16))
               if dict(c.params)["change"] == "fp8 row scales")
    assert regions_under_accepted(graphs, {}, known) == []  # nothing accepted: nothing new
    fresh = regions_under_accepted(graphs, {fp8.region_signature: fp8}, known)
    assert fresh and all(o.region.signature not in known for o in fresh)
    assert all("aten.amax.default" in {str(n.target) for n in o.members} for o in fresh)  # rows' scales

    served = []

    def follow_up():
        served.append(len(served))
        return fresh if len(served) == 1 else []

    with KnowledgeBase(tmp_path / "kb.sqlite") as kb:
        batches = list(_proposal_batches("search", occurrences, profile_graphs(graphs, occurrences), kb, 0, None,
                                         graphs, {}, follow_up=follow_up))
    assert len(batches) == 2 and served == [0, 1]  # asked again after the second batch, then done
    new = {o.region.signature for o in fresh}
    assert batches[1] and {c.region_signature for c in batches[1]} == new
    assert not new & {c.region_signature for c in batches[0]}


def test_what_the_regional_loop_accepts_kopt_compile_regional_applies(tmp_path):
    """The user's path: optimize regionally, then kopt.compile(passes="auto", regional=True) finds the
    accepted region candidates and pipeline choice by the block graph's signatures, verifies them
    again and applies them; the output still matches the float64 reference."""
    import kopt

    model, inputs = tiny_block_stack()
    kb_path = tmp_path / "kb.sqlite"
    # kernels first (a run of choices alone puts codegen-fuse over these regions), then the choices on top
    kernels = optimize(model, inputs, budget_min=5, kb_path=kb_path, regional=True, clock="cost-model",
                       progress=False, workers=1, pipelines=False)
    result = optimize(model, inputs, budget_min=5, kb_path=kb_path, regional=True, clock="cost-model",
                      progress=False, workers=1)
    accepted = [e.candidate for run in (kernels, result) for e in run.evaluations if e.status is Status.ACCEPTED]
    regions = [c for c in accepted if c.kind is not CandidateKind.PASS_CHOICE]
    choices = [c for c in accepted if c.kind is CandidateKind.PASS_CHOICE]
    assert regions and choices  # the cost model keeps both kinds on this block
    compiled = kopt.compile(model, passes="auto", regional=True, lower="eager", kb=kb_path, check_lowering=False,
                            progress=False)
    fresh = torch.randn(2, 24, 32)
    with torch.no_grad():
        got = compiled(fresh)
    records = {p.name: p for g in compiled.kopt_report.graphs for p in g.passes}
    assert any("KB pipeline choice re-verified" in n for n in records["kb-pipeline"].notes)
    assert any(f"{len(regions)} region occurrence(s) replaced" in n for n in records["kb-apply"].notes)
    compiled.undo()
    assert _rel_err(got, reference_forward(model, fresh)) < 1e-5


def test_the_region_plot_marks_regions_a_pipeline_choice_rewrote_away(tmp_path):
    """A region an accepted choice fused away has no "after" time of its own: NaN in the rows (not its old
    time, which read as "no change"), labelled in the plot."""
    import math

    from kopt.agent.propose.pipeline import propose_pipelines
    from kopt.agent.report import region_rows

    model, inputs = tiny_block_stack()
    result = optimize(model, inputs, budget_min=5, kb_path=tmp_path / "kb.sqlite", regional=True, lower="eager",
                      max_candidates=1, micro=False, progress=False, workers=1, pipelines=False)
    fuse = next(c for c in propose_pipelines(result.graphs) if dict(c.params).get("change") == "add codegen-fuse")
    result.accepted = {fuse.region_signature: fuse}  # as if the run had kept it
    rows = region_rows(result)
    gone = [r for r in rows if math.isnan(r[2])]
    assert gone and all(r[1] > 0 for r in gone)
    assert result.plot(tmp_path / "regions.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_region_plot_marks_a_regions_time_as_inductor_lowers_it_where_measured(tmp_path):
    """The profile's "before" runs a region op by op; where the micro step timed the region as Inductor
    lowers it (a GPU run), the plot marks that too, per model call (time per occurrence × occurrences),
    and only those measurements count (an op-by-op fallback is not one)."""
    from kopt.agent.micro import MicroBench
    from kopt.agent.report import lowered_per_call

    model, inputs = tiny_block_stack()
    result = optimize(model, inputs, budget_min=5, kb_path=tmp_path / "kb.sqlite", regional=True, lower="eager",
                      max_candidates=1, micro=False, progress=False, workers=1, pipelines=False)
    assert result.lowered_s == {}  # no micro step ran: nothing measured
    region = max(result.profile.regions, key=lambda r: r.seconds)
    bench = MicroBench(result.clock)
    bench._original_ms = {region.region.signature: [0.2, 0.3, 0.4], "other": [1.0]}
    bench._against = {region.region.signature: MicroBench.LOWERED, "other": "the original region op by op"}
    result.lowered_s = {k: ms / 1e3 for k, ms in bench.lowered_ms().items()}
    assert result.lowered_s == {region.region.signature: 0.3e-3}
    assert lowered_per_call(result) == {region.region.signature[:12]: 0.3e-3 * region.occurrences}
    assert result.plot(tmp_path / "regions.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_once_a_candidate_is_judged_only_the_next_baselines_side_stays():
    """keep_only drops the sides no later A/B times (their memory goes to the verifier and the micro
    step); the kept side still runs the whole forward with its candidates."""
    model, inputs = tiny_block_stack()
    candidate, signature = _gated_candidate(model, inputs)
    clock = RegionalClock(model, inputs, lower="eager")
    try:
        clock.samples({}, 1, 0)
        clock.samples({signature: candidate}, 1, 0)
        assert len(clock._sides) == 2
        clock.keep_only({signature: candidate})  # the candidate was accepted: it is the next baseline
        assert list(clock._sides) == [clock._key({signature: candidate})]
        fresh = torch.randn(2, 24, 32)
        side = clock._side({signature: candidate})
        side.activate()
        with torch.no_grad():
            got = side.compiled(fresh)
    finally:
        clock.close()
    assert _rel_err(got, reference_forward(model, fresh)) < 1e-5


def test_a_baseline_outside_its_contract_stops_the_run_before_any_candidate(tmp_path, monkeypatch):
    """A compile that is wrong by itself (here a pass that scales each block's output by 1.5, under a
    1e-2 contract) would have every candidate's model check blamed for its error: the run checks the
    baseline's model output first and stops, saying why, with no candidate evaluated."""
    import kopt.agent.regional_clock as regional_clock
    from kopt.passes.base import FunctionPass

    def scale_output(graph_module, ctx):
        output = next(n for n in graph_module.graph.nodes if n.op == "output")
        first = output.args[0][0] if isinstance(output.args[0], (tuple, list)) else output.args[0]
        with graph_module.graph.inserting_before(output):
            scaled = graph_module.graph.call_function(torch.ops.aten.mul.Tensor, (first, 1.5))
        output.replace_input_with(first, scaled)
        graph_module.recompile()

    wrong = FunctionPass("scale-output", "wrong on purpose", Contract.tolerance(1e-2), scale_output)
    original = regional_clock.side_passes
    monkeypatch.setattr(regional_clock, "side_passes", lambda chosen: [*original(chosen), wrong])
    model, inputs = tiny_block_stack()
    result = optimize(model, inputs, budget_min=5, kb_path=tmp_path / "kb.sqlite", regional=True, lower="eager",
                      max_candidates=3, micro=False, seed=0, model_name="stack", progress=False, workers=1)
    assert result.evaluations == []
    assert "baseline" in result.stopped and "outside its contract" in result.stopped
    assert "VIOLATION" in result.stopped
    assert all(getattr(b, "_compiled_call_impl", None) is None for b in model.blocks)


def test_a_candidate_timed_in_place_of_an_accepted_one_records_which(tmp_path):
    """The end-to-end speedup of a region's second candidate is over the first, and its record says so
    (``e2e.against``), so that the knowledge base can rank the two by their speedup over the base."""
    from kopt.agent.bench import BenchConfig, measure

    class SameTime:  # the speedup's value is not what is checked here
        name, lower = "fixed", "eager"

        def samples(self, chosen, count, stream):
            return [1.0] * count

    model, inputs = tiny_block_stack()
    first, _ = _gated_candidate(model, inputs)
    second = dataclasses.replace(first, source=first.source + "\n# the same computation, another proposal\n")
    graphs = capture_graphs(model, inputs, regional=True)
    config = BenchConfig(samples=3, resamples=50)
    alone = measure(graphs, {}, first, SameTime(), config)
    replacing = measure(graphs, {first.region_signature: first}, second, SameTime(), config)
    assert alone.speedup.against is None
    assert replacing.speedup.against == first.content_hash != second.content_hash
