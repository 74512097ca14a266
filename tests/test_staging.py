"""Binding-time staging: constants folded, step-invariant work hoisted and memoized on values."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import kopt
from kopt.config import Role
from kopt.fx.binding_time import binding_times
from kopt.fx.capture import trace_function
from kopt.fx.staged_program import BothStages, StagedProgram, split_stages, value_key
from kopt.passes.base import PassContext
from kopt.passes.graph.staging import HOIST_KEY, BindingTimeStaging
from kopt.passes.pipeline import default_pipeline
from kopt.workloads import get_workload
from tests.contracts import assert_within_contract, float64_output

aten = torch.ops.aten
EXPECTED_FOLDS = {"qwen-image": 5, "flux2": 2}  # Qwen: RoPE tables from shapes; FLUX.2: scalar tables


UNSTAGED = [p.name for p in default_pipeline() if p.name != "staging"]  # "auto" without staging


def _ran_unstaged(unstaged: kopt.KoptModule) -> bool:
    """The reference compiled its own graph (not a cache entry of the staged one, nor eager)."""
    graphs = unstaged.kopt_report.graphs
    return bool(graphs) and [p.name for p in graphs[-1].passes] == UNSTAGED and graphs[-1].fallback is None


def test_fires_on_tiny_dits_and_cfg_pair_hits_the_memo(tiny_dit):
    """Folds and hoists on both models; the CFG pair's second call reuses the first's stage. Staging is
    exact, so both calls are bit-identical to the same pipeline without staging; the pipeline's other
    passes keep their contract against a float64 reference."""
    workload, model, inputs = tiny_dit
    compiled = kopt.compile(model, lower="eager", verify=True)
    unstaged = kopt.compile(model, UNSTAGED, lower="eager")
    with torch.no_grad():
        output = compiled(**inputs)[0]
        assert torch.equal(output, unstaged(**inputs)[0])
        assert_within_contract(output, eager=model(**inputs)[0], float64=float64_output(model, inputs),
                               report=compiled.kopt_report)
        record = compiled.kopt_report.pass_records("staging")[0]
        assert record.matches["fold-constant"] == EXPECTED_FOLDS[workload.name]
        assert record.matches["hoist-step-invariant"] == 1
        memo = compiled.kopt_report.graphs[0].memo
        hits, misses = memo.hits, memo.misses
        cond, uncond = workload.inputs("tiny", seed=5), workload.inputs("tiny", seed=6, negative=True)
        out_cond, out_uncond = workload.cfg_pair(compiled, cond, uncond, t=321.0)
        ref_cond, ref_uncond = workload.cfg_pair(unstaged, cond, uncond, t=321.0)
    assert torch.equal(out_cond[0], ref_cond[0]) and torch.equal(out_uncond[0], ref_uncond[0])
    assert _ran_unstaged(unstaged)
    assert (memo.misses - misses, memo.hits - hits) == (1, 1)


@pytest.fixture(scope="module")
def compiled_flux2():
    """(workload, model, compiled, unstaged): the default pipeline with and without staging."""
    torch._dynamo.reset()
    workload = get_workload("flux2")
    torch.manual_seed(1)
    model = workload.model("tiny")
    compiled = kopt.compile(model, lower="eager", memo_entries=2)
    unstaged = kopt.compile(model, UNSTAGED, lower="eager")
    with torch.no_grad():
        compiled(**workload.inputs("tiny", seed=0))
    return workload, model, compiled, unstaged


@settings(max_examples=12, deadline=None)
@given(steps=st.lists(st.sampled_from([0.0, 125.0, 500.0, 999.0, 1000.0]), min_size=1, max_size=8),
       guidance=st.sampled_from([1.0, 3.5]), seed=st.integers(0, 1000))
def test_property_timestep_sequences_with_repeats_and_changes(compiled_flux2, steps, guidance, seed):
    """Any sequence of timesteps (repeats, changes, returns) gives, bit for bit, what the same pipeline
    without staging gives, and that keeps the pipeline's contract against a float64 reference."""
    workload, model, compiled, unstaged = compiled_flux2
    inputs = workload.inputs("tiny", seed=seed)
    inputs["guidance"] = torch.full((1,), guidance)
    with torch.no_grad():
        for t in steps:
            inputs["timestep"] = torch.full((1,), t) / 1000
            output = compiled(**inputs)[0]
            assert torch.equal(output, unstaged(**inputs)[0])
        assert_within_contract(output, eager=model(**inputs)[0], float64=float64_output(model, inputs),
                               report=compiled.kopt_report)
    memo = compiled.kopt_report.graphs[-1].memo
    assert memo.entries <= 2 and memo.misses >= 1 and _ran_unstaged(unstaged)


def test_memo_is_bounded_over_many_steps(compiled_flux2):
    """Fifty denoising steps leave at most two entries; everything older was evicted."""
    workload, _model, compiled, _unstaged = compiled_flux2
    inputs = workload.inputs("tiny", seed=3)
    with torch.no_grad():
        compiled(**inputs)  # (re)compiles: each test starts from a reset dynamo cache
        memo = compiled.kopt_report.graphs[-1].memo
        misses, evictions, calls = memo.misses, memo.evictions, memo.calls
        for step in range(50):
            inputs["timestep"] = torch.full((1,), 1.0 - step / 50 - 1e-3)
            compiled(**inputs)
    assert memo.calls - calls == 50 and memo.entries == 2
    assert memo.bypassed > 0  # a new timestep every call: the memo stops reading the keys
    assert memo.evictions - evictions >= memo.misses - misses - 2


def test_batch_whose_rows_share_a_timestep():
    """Batch 2 with one shared timestep value: memoized stage, the unstaged pipeline's output."""
    workload = get_workload("flux2")
    torch.manual_seed(2)
    model = workload.model("tiny")
    compiled = kopt.compile(model, lower="eager")
    unstaged = kopt.compile(model, UNSTAGED, lower="eager")
    one = workload.inputs("tiny", seed=4)
    batch = {k: (torch.cat([v, v.flip(0) if k == "hidden_states" else v]) if isinstance(v, torch.Tensor) else v)
             for k, v in one.items()}
    batch["hidden_states"] = torch.randn_like(batch["hidden_states"])
    batch["timestep"] = torch.full((2,), 0.25)
    batch["guidance"] = torch.full((2,), 4.0)
    with torch.no_grad():
        assert torch.equal(compiled(**batch)[0], unstaged(**batch)[0])
        batch["timestep"] = torch.full((2,), 0.75)
        output = compiled(**batch)[0]
        assert torch.equal(output, unstaged(**batch)[0])
        assert_within_contract(output, eager=model(**batch)[0], float64=float64_output(model, batch),
                               report=compiled.kopt_report)
    assert compiled.kopt_report.graphs[0].memo.misses == 2 and _ran_unstaged(unstaged)


def _toy(x, t, w1, w2):
    embedding = torch.nn.functional.silu(torch.cat([torch.sin(t), torch.cos(t)], -1) @ w1)
    scale, shift = (embedding @ w2).chunk(2, dim=-1)
    return x * (1 + scale) + shift


def _traced_toy():
    w1, w2, table = torch.randn(8, 16), torch.randn(16, 32), torch.arange(6.0)
    def fn(x, t):
        return _toy(x, t, w1, w2) + (table * 2).sum()
    graph_module = trace_function(fn, torch.randn(3, 16), torch.randn(1, 4))
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    placeholders[0].meta["kopt_role"], placeholders[1].meta["kopt_role"] = Role.PER_CALL, Role.STEP_INVARIANT
    return fn, graph_module


def test_binding_times_and_golden_split():
    """The GEMMs on t move to the invariant stage; the per-call stage keeps only x's elementwise work."""
    fn, graph_module = _traced_toy()
    times = binding_times(graph_module.graph)
    mms = [n for n in graph_module.graph.nodes if n.target is aten.mm.default]
    assert [times[n] for n in mms] == [Role.STEP_INVARIANT, Role.STEP_INVARIANT]
    ctx = PassContext("staging")
    BindingTimeStaging().apply(graph_module, ctx)
    graph_module.recompile()
    assert ctx.matches == {"fold-constant": 1, "hoist-step-invariant": 1}  # (table * 2).sum() folded

    split = split_stages(graph_module, graph_module.meta[HOIST_KEY])
    invariant_ops = {str(n.target) for n in split.invariant.graph.nodes if n.op == "call_function"}
    main_ops = {str(n.target) for n in split.main.graph.nodes if n.op == "call_function"}
    assert "aten.mm.default" in invariant_ops and "aten.mm.default" not in main_ops
    assert "aten.sin.default" not in main_ops and split.key_positions == [1]
    program = StagedProgram(split.invariant, split.main, split.key_positions)
    x, t = torch.randn(3, 16), torch.randn(1, 4)
    assert torch.equal(program(x, t), fn(x, t))
    assert torch.equal(program(torch.randn(3, 16) * 0 + x, t.clone()), fn(x, t))
    assert (program.stats.hits, program.stats.misses) == (1, 1)


def test_value_key_distinguishes_values_dtypes_and_shapes():
    a = torch.tensor([0.5])
    assert value_key([a]) == value_key([a.clone()])
    assert value_key([a]) != value_key([torch.tensor([0.25])])
    assert value_key([a]) != value_key([a.double()])
    assert value_key([a]) != value_key([a.reshape(())])
    assert value_key([torch.tensor([0.0])]) != value_key([torch.tensor([-0.0])])  # different bytes: safe miss


def test_value_key_reads_expanded_and_strided_timesteps():
    """Pipelines that pass the raw timestep (Wan, SD3, CogVideoX) hand over ``t.expand(batch)``: a
    zero stride, also at batch 1, where ``contiguous()`` keeps it."""
    t = torch.tensor(500.0)
    assert value_key([t.expand(1)]) == value_key([torch.tensor([500.0])])
    assert value_key([t.expand(2)]) == value_key([torch.tensor([500.0, 500.0])])
    strided = torch.arange(6.0).reshape(2, 3)[:, ::2]
    assert value_key([strided]) == value_key([strided.contiguous()])


def _recreate_every_mm(graph_module, ctx):
    """Replaces each mm by an identical copy (new node names), as an unaware later pass might."""
    for node in list(graph_module.graph.nodes):
        if node.target is aten.mm.default and ctx.fire("recreate", node):
            with graph_module.graph.inserting_after(node):
                copy = graph_module.graph.node_copy(node)
            node.replace_all_uses_with(copy)
            graph_module.graph.erase_node(node)


def test_a_later_pass_that_removes_the_frontier_leaves_the_graph_unstaged():
    """The model still runs correctly, without the memo, and the report says why."""
    workload = get_workload("flux2")
    torch.manual_seed(3)
    model = workload.model("tiny")
    later = kopt.FunctionPass("recreate-mm", "test", kopt.Contract.exact(), _recreate_every_mm)
    compiled = kopt.compile(model, passes=["auto", later], lower="eager")
    inputs = workload.inputs("tiny", seed=8)
    with torch.no_grad():
        assert_within_contract(compiled(**inputs)[0], eager=model(**inputs)[0],
                               float64=float64_output(model, inputs), report=compiled.kopt_report, passes=[later])
    graph = compiled.kopt_report.graphs[0]
    assert graph.memo is None
    assert any("not split out" in note for note in graph.passes[-1].notes)


def test_report_counts_what_a_memo_hit_skips():
    """The note states the hoisted GEMM FLOPs and the bytes of weights they read."""
    w1, w2 = torch.randn(256, 1024), torch.randn(1024, 512)  # 1 MiB + 2 MiB of float32

    def fn(x, t):
        return x * (torch.sin(t) @ w1 @ w2)

    graph_module = trace_function(fn, torch.randn(3, 512), torch.randn(1, 256))
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    placeholders[0].meta["kopt_role"], placeholders[1].meta["kopt_role"] = Role.PER_CALL, Role.STEP_INVARIANT
    ctx = PassContext("staging")
    BindingTimeStaging().apply(graph_module, ctx)
    flops = 2 * 256 * 1024 + 2 * 1024 * 512
    assert f"({flops / 1e6:,.1f} MFLOP of GEMMs reading 3.0 MiB of constants" in ctx.notes[-1]


def _staged_toy(**options):
    fn, graph_module = _traced_toy()
    BindingTimeStaging().apply(graph_module, PassContext("staging"))
    graph_module.recompile()
    split = split_stages(graph_module, graph_module.meta[HOIST_KEY])
    return fn, StagedProgram(split.invariant, split.main, split.key_positions, **options)


def test_a_memo_that_keeps_missing_stops_reading_the_keys_then_probes_again():
    """A new timestep every call (a guidance-distilled pipeline): after three misses in a row the
    stage is computed without reading the keys for ``bypass_calls`` calls, with the same outputs."""
    fn, program = _staged_toy(probe_misses=3, bypass_calls=4)
    x = torch.randn(3, 16)
    steps = [torch.randn(1, 4) for _ in range(9)]
    for t in steps:
        assert torch.equal(program(x, t), fn(x, t))
    assert (program.stats.misses, program.stats.bypassed, program.stats.hits) == (5, 4, 0)
    program(x, steps[-1])  # the probe after the bypass: the last memoized step hits again
    assert program.stats.hits == 1


def test_a_cfg_pattern_never_bypasses_the_memo():
    """Each timestep twice (conditional, unconditional): every second call hits, so misses never
    come three in a row and every pair shares one stage."""
    fn, program = _staged_toy(probe_misses=3, bypass_calls=4)
    x = torch.randn(3, 16)
    for _ in range(10):
        t = torch.randn(1, 4)
        assert torch.equal(program(x, t), fn(x, t))
        assert torch.equal(program(x, t.clone()), fn(x, t))
    assert (program.stats.hits, program.stats.misses, program.stats.bypassed) == (10, 10, 0)


def test_a_bypassed_call_runs_both_stages_as_one_program_when_given():
    """With ``both`` (what kopt replays from one CUDA graph on a GPU) the bypass calls it, and only it."""
    fn, graph_module = _traced_toy()
    BindingTimeStaging().apply(graph_module, PassContext("staging"))
    graph_module.recompile()
    split = split_stages(graph_module, graph_module.meta[HOIST_KEY])
    calls = []
    both = BothStages(split.invariant, split.main, split.key_positions)
    program = StagedProgram(split.invariant, split.main, split.key_positions, probe_misses=2, bypass_calls=3,
                            both=lambda *args: calls.append(1) or both(*args))
    x = torch.randn(3, 16)
    for _ in range(5):
        t = torch.randn(1, 4)
        assert torch.equal(program(x, t), fn(x, t))
    assert len(calls) == program.stats.bypassed == 3 and program.stats.misses == 2


def test_probe_misses_zero_keeps_the_memo_always_on():
    _fn, program = _staged_toy(probe_misses=0)
    x = torch.randn(3, 16)
    for _ in range(6):
        program(x, torch.randn(1, 4))
    assert (program.stats.misses, program.stats.bypassed) == (6, 0)


def test_value_key_reads_several_keys_in_one_copy():
    a, b = torch.tensor([0.5]), torch.arange(6.0).reshape(2, 3)
    key = value_key([a, 7, b.to(torch.bfloat16)])
    assert key[1] == ("value", 7) and key[0][3] == a.numpy().tobytes()
    assert key[2][3] == b.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
