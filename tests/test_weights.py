"""Weights changed after compiling: read live, derived again (default), raise, ignore, kopt_refresh()."""

from __future__ import annotations

import pytest
import torch

import kopt
from tests.conftest import rel_err


class TwoLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x):
        # the same product twice, so that the redundancy pass fires (and no weight is transformed)
        return self.b(torch.relu(self.a(x))) + self.b(torch.relu(self.a(x)))


def test_weights_no_pass_transformed_follow_any_write_without_a_check():
    """In-place writes, load_state_dict and a new Parameter: all read by the next call, nothing
    rebuilt or re-derived, nothing watched."""
    model = TwoLayer().eval()
    compiled = kopt.compile(model, lower="eager")
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert rel_err(compiled(x), model(x)) < 1e-6
        model.a.weight.mul_(-1.5)
        assert rel_err(compiled(x), model(x)) < 1e-6
        model.load_state_dict(TwoLayer().state_dict())
        assert rel_err(compiled(x), model(x)) < 1e-6
        model.b.weight = torch.nn.Parameter(torch.randn(16, 16))
        assert rel_err(compiled(x), model(x)) < 1e-6
    graph = compiled.kopt_report.graphs[0]
    assert compiled.kopt_report.matches("redundancy") > 0
    assert graph.weights["live"] == 4 and graph.weights["watched"] == 0
    assert graph.weight_refreshes == graph.weight_rederivations == 0


class Siblings(torch.nn.Module):
    """Two linears reading one input (sibling-merge concatenates their weights) and one that no
    pass transforms."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.out = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.out(self.q(x) * self.k(x))


def _compile_siblings(via: str, **options):
    """(model, compiled, report()) through ``kopt.compile`` or ``torch.compile(backend="kopt")``."""
    torch.manual_seed(0)
    model = Siblings().eval()
    if via == "kopt.compile":
        compiled = kopt.compile(model, lower="eager", **options)
        return model, compiled, lambda: compiled.kopt_report
    compiled = torch.compile(model, backend="kopt", options={"lower": "eager", **options})

    def report():  # one report per options in a process: this model's graph is the last
        return kopt.Report(graphs=kopt.last_backend_report().graphs[-1:])

    return model, compiled, report


def _compiled(policy, **options):
    torch.manual_seed(0)
    model = Siblings().eval()
    compiled = kopt.compile(model, lower="eager", on_weight_change=policy, **options)
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert rel_err(compiled(x), model(x)) < 1e-6
    assert compiled.kopt_report.matches("sibling-merge") == 1
    return model, compiled, x


def test_derived_again_after_in_place_update_and_load_state_dict():
    model, compiled, x = _compiled("recompile")
    with torch.no_grad():
        model.q.weight.mul_(-1.5)
        assert rel_err(compiled(x), model(x)) < 1e-6
        other = Siblings().eval()
        model.load_state_dict(other.state_dict())
        assert rel_err(compiled(x), other(x)) < 1e-6
    graph = compiled.kopt_report.graphs[0]
    assert graph.weight_rederivations == 2 and graph.weight_refreshes == 0


def test_raise_policy_names_the_fix():
    model, compiled, x = _compiled(kopt.WeightChange.RAISE)
    with torch.no_grad():
        model.k.bias.add_(1.0)
        with pytest.raises(kopt.WeightsChangedError, match="kopt_refresh"):
            compiled(x)
        compiled.kopt_refresh()
        assert rel_err(compiled(x), model(x)) < 1e-6


def test_ignore_policy_skips_the_check():
    """Nothing is watched; a merged weight kept apart from the module's (share_weights=False) keeps
    its compile-time value (documented)."""
    model, compiled, x = _compiled("ignore", share_weights=False)
    with torch.no_grad():
        before = compiled(x)
        model.q.bias.add_(1.0)
        assert torch.equal(compiled(x), before)
    graph = compiled.kopt_report.graphs[0]
    assert graph.weight_refreshes == graph.weight_rederivations == 0 and graph.weights["check"] == "none"


def test_ignore_policy_still_sees_writes_into_shared_weights():
    """With the module's weights shared with the merged one (the default) an in-place write is a
    write into what the graph reads: seen without any check or re-derivation."""
    model, compiled, x = _compiled("ignore")
    with torch.no_grad():
        model.q.bias.add_(1.0)
        assert rel_err(compiled(x), model(x)) < 1e-6
    graph = compiled.kopt_report.graphs[0]
    assert graph.weight_refreshes == graph.weight_rederivations == 0 and graph.weights["check"] == "none"


def test_replaced_parameter_object_is_detected():
    """Assigning a new Parameter to a merged linear (not an in-place write) is caught too."""
    model, compiled, x = _compiled("recompile")
    with torch.no_grad():
        model.q.weight = torch.nn.Parameter(torch.randn(16, 16))
        assert rel_err(compiled(x), model(x)) < 1e-6


@pytest.mark.parametrize("share", [True, False], ids=["shared", "kept-apart"])
@pytest.mark.parametrize("via", ["kopt.compile", "backend"])
def test_data_copy_into_a_merged_weight_is_not_missed(via, share):
    """``param.data.copy_`` (how PEFT hot-swaps an adapter) changes neither the parameter's version
    counter nor its storage; the compiled output follows it anyway, without a recompilation: a
    shared weight because the write lands in the merged weight, one kept apart because its
    checksum changed and the merged weight is derived again."""
    model, compiled, report = _compile_siblings(via, share_weights=share)
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        x = torch.randn(4, 16)
        assert rel_err(compiled(x), model(x)) < 1e-6
        model.q.weight.data.copy_(torch.randn(16, 16))
        x = torch.randn(4, 16)
        assert rel_err(compiled(x), model(x)) < 1e-6
        model.k.bias.data.copy_(torch.randn(16))
        assert rel_err(compiled(x), model(x)) < 1e-6
    graph = report().graphs[0]
    assert report().matches("sibling-merge") == 1 and graph.fallback is None
    assert graph.weight_refreshes == 0  # re-derived, not rebuilt (and not recompiled: error_on_recompile)
    assert graph.weight_rederivations == (0 if share else 2)


def test_a_weight_no_pass_transformed_is_read_live():
    """The output projection is not merged: it stays an input of the lowered graph, so a write
    to it needs no check and nothing is re-derived."""
    model, compiled, report = _compile_siblings("kopt.compile")
    with torch.no_grad():
        x = torch.randn(4, 16)
        compiled(x)
        model.out.weight.data.copy_(torch.randn(16, 16))
        assert rel_err(compiled(x), model(x)) < 1e-6
    graph = report().graphs[0]
    assert graph.weight_rederivations == 0 and graph.weight_refreshes == 0
    assert graph.weights["live"] == 2 and graph.weights["derived"] == 2  # out.weight/bias; merged weight/bias


def test_version_check_sees_ordinary_writes_and_says_what_it_misses():
    """``weight_check="version"`` costs nothing per call and sees writes through the parameter
    (``load_state_dict``, ``param.copy_``) but not through ``.data`` into a weight kept apart from
    the merged one (``share_weights=False``): the documented trade-off."""
    model, compiled, report = _compile_siblings("kopt.compile", weight_check="version", share_weights=False)
    x = torch.randn(4, 16)
    with torch.no_grad():
        compiled(x)
        model.q.weight.copy_(torch.randn(16, 16))
        assert rel_err(compiled(x), model(x)) < 1e-6
        model.q.weight.data.copy_(torch.randn(16, 16))
        assert rel_err(compiled(x), model(x)) > 1e-3
    assert report().graphs[0].weight_rederivations == 1


def test_version_check_misses_nothing_of_shared_weights():
    """With the module's weights shared with the merged one (the default), a ``.data`` write is a
    write into what the graph reads: seen by the version check too, with no re-derivation."""
    model, compiled, report = _compile_siblings("kopt.compile", weight_check="version")
    x = torch.randn(4, 16)
    with torch.no_grad():
        compiled(x)
        model.q.weight.data.copy_(torch.randn(16, 16))
        assert rel_err(compiled(x), model(x)) < 1e-6
    assert report().graphs[0].weight_rederivations == 0


def test_checksum_sees_rows_swapped_in_place():
    """A permutation of a weight's rows keeps every value; the row-wise checksum still sees it."""
    model, compiled, _ = _compile_siblings("kopt.compile", share_weights=False)
    x = torch.randn(4, 16)
    with torch.no_grad():
        compiled(x)
        model.k.weight.data[[0, 5]] = model.k.weight.data[[5, 0]]
        assert rel_err(compiled(x), model(x)) < 1e-6


class TimestepModulated(torch.nn.Module):
    """A step-invariant linear on the timestep (staging hoists and memoizes it) scaling x."""

    def __init__(self) -> None:
        super().__init__()
        self.time = torch.nn.Linear(8, 16)
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x, timestep):
        return self.proj(x) * self.time(timestep)


def test_a_changed_weight_of_the_memoized_stage_is_not_served_from_the_memo():
    torch.manual_seed(0)
    model = TimestepModulated().eval()
    compiled = kopt.compile(model, lower="eager")
    x, timestep = torch.randn(4, 16), torch.randn(1, 8)
    with torch.no_grad():
        compiled(x, timestep)
        compiled(x, timestep)
        graph = compiled.kopt_report.graphs[0]
        assert graph.memo is not None and graph.memo.hits == 1
        model.time.weight.data.copy_(torch.randn(16, 8))
        assert rel_err(compiled(x, timestep), model(x, timestep)) < 1e-6


def test_fp8_weights_are_quantized_again_after_a_hot_swap():
    """An FP8 copy of a merged Q/K/V weight follows a ``.data`` write to one of the originals: the
    result equals a fresh compilation of the changed model."""
    import copy

    from kopt.fp8 import Fp8Config
    from tests.conftest import tiny_model_and_inputs

    _, model, inputs = tiny_model_and_inputs("flux2", seed=3, dtype=torch.bfloat16)
    compiled = kopt.compile(model, fp8=Fp8Config(min_features=16), lower="eager")
    with torch.no_grad():
        compiled(**inputs)
        to_q = model.transformer_blocks[0].attn.to_q.weight
        to_q.data.copy_(torch.randn_like(to_q) * to_q.std())
        fresh = kopt.compile(copy.deepcopy(model), fp8=Fp8Config(min_features=16), lower="eager")
        assert torch.equal(compiled(**inputs)[0], fresh(**inputs)[0])
    assert compiled.kopt_report.matches("fp8-linear") > 0
    assert compiled.kopt_report.graphs[0].weight_rederivations == 1


def test_a_merged_weight_cannot_be_derived_again_from_released_siblings():
    """release_weights=True freed the siblings' originals; a new weight for one of them cannot be merged
    with the others any more: the call raises instead of computing with stale or empty weights."""
    torch.manual_seed(0)
    model = Siblings().eval()
    compiled = kopt.compile(model, lower="eager", release_weights=True, share_weights=False)
    x = torch.randn(4, 16)
    with torch.no_grad():
        reference = model(x)
        assert rel_err(compiled(x), reference) < 1e-6  # compiles; the merged originals are then released
        assert compiled.kopt_report.released_bytes > 0
        model.q.weight.data = torch.randn(16, 16)
        with pytest.raises(kopt.WeightsReleasedError, match="release_weights"):
            compiled(x)


def _transpose_weights_by_hand(graph_module, ctx):
    """A user's pass that precomputes W.T with add_constant, not derive(): kopt cannot tell its source."""
    from kopt.fx.constants import add_constant, constant_value
    from kopt.fx.graph_utils import replace

    for node in list(graph_module.graph.nodes):
        weight = constant_value(node.args[0]) if node.target is torch.ops.aten.t.default else None
        if weight is not None and ctx.fire("pretranspose", node):
            constant = add_constant(graph_module, "user_weight_t", weight.t().contiguous(), node)
            replace(node, constant, pass_name="pretranspose", rule="pretranspose")
    graph_module.graph.eliminate_dead_code()


def test_a_constant_of_unknown_provenance_rebuilds_on_any_weight_change():
    """Baked in, watched conservatively (every weight), and the whole graph rebuilt on a change."""
    torch.manual_seed(0)
    model = TwoLayer().eval()
    pretranspose = kopt.FunctionPass("pretranspose", "test: W.T by hand", kopt.Contract.exact(),
                                     _transpose_weights_by_hand)
    compiled = kopt.compile(model, passes=[pretranspose], lower="eager")
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert rel_err(compiled(x), model(x)) < 1e-6
        model.a.weight.data.copy_(torch.randn(16, 16))
        assert rel_err(compiled(x), model(x)) < 1e-6
    graph = compiled.kopt_report.graphs[0]
    assert compiled.kopt_report.matches("pretranspose") == 4  # a and b, each applied twice
    assert graph.weight_refreshes == 1 and graph.weights["on_change"] == "rebuild"


@pytest.mark.slow
def test_weights_made_inputs_leave_no_size_guard_dynamo_cannot_check():
    """Inductor, cold (no FX graph or autograd cache), on SD3: a bound weight or hoisted value is
    lowered as a static fake of dynamo's mode. Given as a real tensor, Inductor would give it size
    symbols, a reshape would guard on them, and dynamo would fail to build the frame's guards."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    from kopt.workloads import get_workload

    workload = get_workload("sd3")
    torch.manual_seed(0)
    model, inputs = workload.model("tiny"), workload.inputs("tiny", seed=int(torch.randint(1 << 30, ())))
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        compiled = kopt.compile(model, progress=False)
        with torch.no_grad():
            got, want = compiled(**inputs)[0], model(**inputs)[0]
    assert rel_err(got, want) < 1e-4
    graphs = compiled.kopt_report.graphs
    assert len(graphs) == 1 and graphs[0].fallback is None and graphs[0].lowering == "inductor"
