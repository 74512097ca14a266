"""The search proposals' order: the pipeline choices (cheap to settle) first, then every kernel family
(one region's launch variants) once before any family is tried twice."""

from __future__ import annotations

import json

from kopt.agent.candidate import Candidate, CandidateKind
from kopt.agent.propose.breadth import breadth_first
from kopt.passes.base import Contract

TOL = Contract.tolerance(1e-2)
SIG = {name: f"{n:064x}" for n, name in enumerate(("region-a", "region-b", "graph-0", "r", "g"), start=1)}


def _variant(region: str, n: int) -> Candidate:
    return Candidate(SIG[region], CandidateKind.CODEGEN_VARIANT, f"def candidate(x):\n    return x * {n}\n", TOL,
                     origin="search", params=(("row_budget", n),))


def _choice(graph: str, change: str, passes: tuple[str, ...] = ()) -> Candidate:
    source = json.dumps({"change": change, "passes": list(passes)})
    return Candidate(SIG[graph], CandidateKind.PASS_CHOICE, source, TOL, origin="search", params=(("change", change),))


def test_choices_first_then_each_kernel_family_once_before_any_twice():
    a = [_variant("region-a", n) for n in (1, 2, 3)]
    b = [_variant("region-b", n) for n in (4, 5)]
    choices = [_choice("graph-0", "drop residual-fp32"), _choice("graph-0", "attention 1x8x64 on flash")]
    ordered = breadth_first([*a, *b, *choices])
    assert ordered == [*choices, a[0], b[0], a[1], b[1], a[2]]


def test_it_only_reorders():
    candidates = [_variant("r", n) for n in range(5)] + [_choice("g", f"drop p{n}") for n in range(3)]
    ordered = breadth_first(candidates)
    assert sorted(c.content_hash for c in ordered) == sorted(c.content_hash for c in candidates)
    assert breadth_first([]) == []


def test_regions_without_headroom_go_after_every_pipeline_choice():
    a = [_variant("region-a", n) for n in (1, 2)]
    b = [_variant("region-b", n) for n in (4, 5)]
    choice = _choice("graph-0", "add fuse-linear-gelu")
    ordered = breadth_first([*a, *b, choice], small={SIG["region-a"]})
    assert ordered == [choice, b[0], b[1], a[0], a[1]]


def test_small_regions_are_those_a_floor_kernel_could_not_move_by_the_bar():
    import types

    def region(signature, headroom_s):
        return types.SimpleNamespace(region=types.SimpleNamespace(signature=signature), headroom_s=headroom_s)

    from kopt.agent.propose.breadth import small_regions

    profile = types.SimpleNamespace(total_s=0.100, regions=[region("x", 0.0005), region("y", 0.002)])
    assert small_regions(profile, 0.01) == {"x"}  # 0.5 % and 2 % of a 100 ms call, against a 1 % bar
    assert small_regions(types.SimpleNamespace(total_s=0.0, regions=[]), 0.01) == set()


def test_pipeline_choices_add_then_attention_then_leave_out():
    """Within a graph: opt-in passes added, then attention backends (settled in seconds by their
    micro check), then default passes left out (the least likely to pay)."""
    from kopt.agent.graphs import capture_graphs
    from kopt.agent.propose.pipeline import propose_pipelines
    from tests.agent.tiny_models import tiny_attention_block

    model, inputs = tiny_attention_block()
    changes = [dict(c.params)["change"] for c in propose_pipelines(capture_graphs(model, inputs), device="cpu")]
    kinds = [change.split(" ", 1)[0] for change in changes]
    assert kinds == sorted(kinds, key=["add", "attention", "drop"].index)
    assert {"add", "attention", "drop"} == set(kinds)


def test_fp8_choices_lead_only_when_half_the_time_outside_regions_beats_every_regions_headroom():
    import types

    from kopt.agent.propose.breadth import fp8_leads

    def region(seconds, headroom_s):
        return types.SimpleNamespace(seconds=seconds, headroom_s=headroom_s)

    a = [_variant("region-a", n) for n in (1, 2)]
    fp8 = [_choice("graph-0", "fp8 tensor scales", ("fp8-linear", "staging")),
           _choice("graph-0", "fp8 row scales + fp8 attention", ("fp8-linear", "fp8-attention", "staging"))]
    other = _choice("graph-0", "fp8 in words only", ("redundancy", "staging"))  # the passes decide, not the words
    candidates = [*a, other, *fp8]
    gemm_bound = types.SimpleNamespace(total_s=0.100, regions=[region(0.020, 0.010)])  # 80 ms outside: 40 > 10
    lead = fp8_leads(candidates, gemm_bound)
    assert lead == {c.content_hash for c in fp8}
    assert breadth_first(candidates, lead=lead) == [*fp8, other, a[0], a[1]]
    elementwise_bound = types.SimpleNamespace(total_s=0.100, regions=[region(0.080, 0.060)])  # 20 ms: 10 < 60
    assert fp8_leads(candidates, elementwise_bound) == set()
    assert fp8_leads(candidates, types.SimpleNamespace(total_s=0.0, regions=[])) == set()


def test_the_choice_accepted_deepest_on_another_model_goes_first(tmp_path):
    """Another model's graph kept FP8 tensor scales, then row scales on top, then row scales + FP8
    attention on top, and found block scales slower: on a new model's graph the warm order tries the
    deepest (the whole end state, one evaluation) first, then the shallower ones, the slower one last."""
    from kopt.agent.kb import KnowledgeBase, Status
    from kopt.agent.pipeline_choice import to_candidate
    from kopt.agent.propose.pipeline import base_pipeline, fp8_choices
    from kopt.agent.propose.warm import warm_order
    from kopt.fp8.config import Fp8Config
    from tests.agent.kb_helpers import GPU_ENV, scaled_gelu_region

    def choices(signature: str) -> dict[str, Candidate]:
        found = {c.change: to_candidate(signature, c) for c in fp8_choices(base_pipeline(), Fp8Config())}
        return found | {"drop residual-fp32": _choice("g", "drop residual-fp32")}

    first, second = scaled_gelu_region(32), scaled_gelu_region(48)
    old = choices(first.signature)
    with KnowledgeBase(tmp_path / "kb.sqlite") as kb:
        kb.record_region(first)
        history = [("fp8 tensor scales", Status.ACCEPTED), ("fp8 block-1x128 scales", Status.SLOWER),
                   ("fp8 row scales", Status.ACCEPTED), ("fp8 row scales + fp8 attention", Status.ACCEPTED)]
        for at, (change, status) in enumerate(history):
            kb.record_candidate(old[change], status=status, reason="measured", environment=GPU_ENV,
                                created_at=float(at + 1))
        new = choices(second.signature)
        ordered = [c.params[0][1] for c in warm_order(new.values(), kb, {})]
    assert ordered[:3] == ["fp8 row scales + fp8 attention", "fp8 row scales", "fp8 tensor scales"]
    assert ordered[-1] == "fp8 block-1x128 scales" and "drop residual-fp32" in ordered[3:-1]
    kernel = _variant("r", 1)  # untried, but a kernel: after every choice, even one that failed elsewhere
    with KnowledgeBase(tmp_path / "kb.sqlite") as kb:
        assert warm_order([kernel, *new.values()], kb, {})[-1] is kernel


def test_an_attention_lesson_transfers_between_shapes():
    from kopt.agent.propose.warm import lesson_key

    ltx = _choice("g", "attention q[1, 32, 6930, 64]k[1, 32, 6930, 64]bfloat16 on math")
    qwen = _choice("graph-0", "attention q[1, 24, 4352, 128]k[1, 24, 4352, 128]bfloat16 on math")
    assert lesson_key(ltx, None) == lesson_key(qwen, None) == ("pipeline", "attention on math")
    assert lesson_key(_choice("g", "attention q[1, 2]k[1, 2]float32 on flash"), None) != lesson_key(qwen, None)
