"""Dynamic shapes: kopt rewrites graphs with symbolic sizes, and one graph serves every size.

Tiny Qwen-Image and FLUX.2 are compiled with ``dynamic=True`` (and with the default, which turns
dynamic after a size changes); the rewrites that fire are counted against the static compile, the
outputs at several image and text lengths are checked against a float64 reference, and the number
of compiled graphs against plain ``torch.compile`` on the same calls.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import kopt
from kopt.fx.graph_utils import missing_meta
from kopt.fx.symbolic import is_symbolic
from kopt.passes.base import Contract
from kopt.workloads import get_workload
from tests.conftest import rel_err

# (latent grid height, width, text tokens). Qwen-Image's text length is specialized by the model
# itself (diffusers turns the mask's length into a Python int), so only its image grid varies.
SIZES = {"qwen-image": [(8, 8, 7), (6, 10, 7), (4, 6, 7)], "flux2": [(8, 8, 7), (6, 10, 5), (4, 6, 11)]}


def inputs_at(name: str, height: int, width: int, text: int, seed: int) -> dict[str, object]:
    """The workload's inputs for a (height x width) latent grid and ``text`` prompt tokens, with a
    timestep of their own."""
    workload = get_workload(name)
    inputs = workload.resized(workload.inputs("tiny", seed=seed), height=height, width=width, text=text, seed=seed)
    inputs["timestep"] = torch.full((1,), 0.25 + 0.05 * (seed % 10))
    return inputs


def _float64(inputs: dict[str, object]) -> dict[str, object]:
    return {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return get_workload(name).model("tiny")


def _rules(report: kopt.Report) -> dict[str, dict[str, int]]:
    return {record.name: dict(record.matches) for record in report.graphs[-1].passes}


def _contract(report: kopt.Report) -> Contract:
    contract = Contract.exact()
    for record, rewrite in zip(report.graphs[-1].passes, kopt.default_pipeline(), strict=True):
        if record.total_matches:
            contract = contract.combine(rewrite.contract)
    return contract


@pytest.mark.parametrize("name", ["qwen-image", "flux2"])
def test_rewrites_fire_on_symbolic_graphs_as_on_static_ones(name):
    """Every default pass fires as often with dynamic=True as on the static graph, and no pass
    specializes a size; only staging differs for Qwen-Image: its RoPE tables depend on the image
    size, so instead of being folded into constants they are hoisted into the memoized stage."""
    model, (h, w, t) = _model(name), SIZES[name][0]
    reports = {}
    for dynamic in (False, True):
        torch._dynamo.reset()
        compiled = kopt.compile(model, lower="eager", dynamic=dynamic)
        with torch.no_grad():
            compiled(**inputs_at(name, h, w, t, seed=1))
        reports[dynamic] = compiled.kopt_report
    static, symbolic = _rules(reports[False]), _rules(reports[True])
    for pass_name in static:
        if pass_name in ("redundancy", "staging"):
            continue  # CSE counts depend on how each capture spells views; staging: below
        assert symbolic[pass_name] == static[pass_name], pass_name
    assert sum(static["sibling-merge"].values()) > 0 and sum(static["fuse-adaln"].values()) > 0
    assert symbolic["staging"]["hoist-step-invariant"] == 1
    folded = {"qwen-image": 2, "flux2": 0}[name]  # tables that now depend on a symbolic size
    assert symbolic["staging"]["fold-constant"] == static["staging"]["fold-constant"] - folded
    graph = reports[True].graphs[-1]
    assert not graph.fallback
    assert not [note for record in graph.passes for note in record.notes if "specialized" in note]
    hoisted_on = next(note for note in graph.passes[-1].notes if "memoized on" in note)
    assert "size()" in hoisted_on or "img_shapes" in hoisted_on  # sizes key the memo


@pytest.mark.parametrize("name", ["qwen-image", "flux2"])
def test_one_graph_for_every_length_and_outputs_within_contract(name):
    """dynamic=True: calls at three image (and, for FLUX.2, text) lengths run one compiled graph,
    each output within the passes' contract of a float64 reference and as close to it as eager."""
    model = _model(name)
    reference = copy.deepcopy(model).double()
    compiled = kopt.compile(model, lower="eager", dynamic=True)
    for seed, (h, w, t) in enumerate(SIZES[name]):
        inputs = inputs_at(name, h, w, t, seed=10 + seed)
        with torch.no_grad():
            out, eager, exact = compiled(**inputs)[0], model(**inputs)[0], reference(**_float64(inputs))[0]
        assert out.shape == (1, h * w, out.shape[-1])
        error, eager_error = rel_err(out, exact), rel_err(eager, exact)
        assert error <= _contract(compiled.kopt_report).rel_tol
        assert error <= 2 * eager_error + 1e-6, (error, eager_error)  # float32 rounding, not a rewrite's
    report = compiled.kopt_report
    assert len(report.graphs) == 1 and report.eager_calls == 0
    if name == "flux2":
        assert report.matches("fuse-qk-norm-rope-real") == 4  # the joint op slices its table per stream
        assert report.pass_records("fuse-qk-norm-rope-real")[0].matches["joint-qk-norm-rope-real"] == 2


@pytest.mark.parametrize("name", ["qwen-image", "flux2"])
def test_kopt_adds_no_recompilation_over_torch_compile(name):
    """Over calls that change image and text lengths, kopt (default dynamic=None) compiles exactly
    as many graphs as plain torch.compile: Qwen-Image's model recompiles per text length itself."""
    model = _model(name)
    calls = [*SIZES[name], (5, 7, 9), (8, 8, 7)]

    def count_graphs(backend: object) -> int:
        graphs = []

        def counting(gm: torch.fx.GraphModule, example_inputs: list) -> object:
            graphs.append(gm)
            return backend(gm, example_inputs)

        torch._dynamo.reset()
        compiled = torch.compile(model, backend=counting)
        with torch.no_grad():
            for seed, (h, w, t) in enumerate(calls):
                compiled(**inputs_at(name, h, w, t, seed=seed))
        return len(graphs)

    plain = count_graphs(lambda gm, example_inputs: gm.forward)
    torch._dynamo.reset()
    compiled = kopt.compile(model, lower="eager")
    with torch.no_grad():
        for seed, (h, w, t) in enumerate(calls):
            inputs = inputs_at(name, h, w, t, seed=seed)
            assert rel_err(compiled(**inputs)[0], model(**inputs)[0]) < 1e-5
    assert len(compiled.kopt_report.graphs) == plain <= {"qwen-image": 3, "flux2": 2}[name]
    assert compiled.kopt_report.matches("fuse-adaln") == 2 * len(compiled.kopt_report.graphs) * {
        "qwen-image": 4, "flux2": 3}[name]


def test_every_node_carries_symbolic_metadata():
    """The captured and rewritten graph has a FakeTensor on every node, with dynamo's symbols in
    the sizes of the image-token activations."""
    model, (h, w, t) = _model("flux2"), SIZES["flux2"][0]
    compiled = kopt.compile(model, lower="eager", dynamic=True)
    with torch.no_grad():
        compiled(**inputs_at("flux2", h, w, t, seed=3))
    graph_module = compiled._kopt_backend.compiled[0].captured.graph_module
    assert not missing_meta(graph_module.graph)
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    assert any(isinstance(n.meta["val"], torch.SymInt) for n in placeholders)  # sizes are inputs
    fused = [n for n in graph_module.graph.nodes if n.target is torch.ops.kopt.adaln_modulation.default]
    assert fused and all(is_symbolic(n.meta["val"]) for n in fused)


class _Scaled(torch.nn.Module):
    """A norm whose eps, and a scale, are Python floats of the module (dynamo passes them as 0-d
    tensors under dynamic shapes), plus a float forward argument."""

    def __init__(self) -> None:
        super().__init__()
        self.eps, self.gain = 1e-6, 0.5
        self.proj = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, shift: float = 0.0) -> torch.Tensor:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.proj(y) * self.gain + shift


def test_module_floats_are_specialized_and_argument_floats_stay_inputs():
    """A float the module owns becomes a number in kopt's graph, guarded by dynamo: changing it
    recompiles (never a stale value); a float passed to forward stays an input (no recompile)."""
    torch.manual_seed(0)
    model = _Scaled().eval()
    compiled = kopt.compile(model, lower="eager", dynamic=True)
    with torch.no_grad():
        for seed, (rows, shift) in enumerate([(5, 0.0), (9, 0.25), (3, -1.5)]):
            x = torch.randn(2, rows, 32, generator=torch.Generator().manual_seed(seed))
            assert rel_err(compiled(x, shift), model(x, shift)) < 1e-6
        graphs = len(compiled.kopt_report.graphs)
        model.gain = 2.0  # a value baked into the graph: dynamo's guard on it must recompile
        x = torch.randn(2, 6, 32)
        assert rel_err(compiled(x, 0.5), model(x, 0.5)) < 1e-6
    assert graphs == 1 and len(compiled.kopt_report.graphs) == 2
    assert compiled.kopt_report.matches("sibling-merge") == 0  # one linear: kopt captured, nothing to merge
    assert not compiled.kopt_report.graphs[-1].fallback


def test_weight_changes_keep_a_symbolic_graph_general():
    """After in-place weight changes (one read live, one behind a merged weight, derived again), the
    symbolic graph still serves every length, with no new capture."""
    model = _model("flux2")
    compiled = kopt.compile(model, lower="eager", dynamic=True)
    sizes = SIZES["flux2"]
    with torch.no_grad():
        compiled(**inputs_at("flux2", *sizes[0], seed=1))
        model.proj_out.weight.mul_(1.5)  # read live by the graph
        model.transformer_blocks[0].attn.to_q.weight.mul_(1.5)  # a source of the merged Q/K/V weight
        for seed, size in enumerate(sizes[1:]):
            inputs = inputs_at("flux2", *size, seed=20 + seed)
            assert rel_err(compiled(**inputs)[0], model(**inputs)[0]) < 1e-5
    graph = compiled.kopt_report.graphs[0]
    assert compiled.kopt_report.matches("sibling-merge") > 0
    assert len(compiled.kopt_report.graphs) == 1 and graph.weight_rederivations == 1 and not graph.fallback


def test_a_pass_that_guards_on_a_size_is_named_in_the_report():
    """A user pass that compares a symbolic size with a number specializes the graph: sound (dynamo
    recompiles for other sizes), and the report says which pass did it and on what."""
    def looks_at_sizes(graph_module: torch.fx.GraphModule, ctx: kopt.PassContext) -> None:
        for node in graph_module.graph.nodes:
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor) and value.dim() == 3 and value.shape[1] == 64:
                ctx.notes.append("saw 64 image tokens")
                return

    probe = kopt.FunctionPass("size-probe", "test", Contract.exact(), looks_at_sizes)
    model, (h, w, t) = _model("flux2"), SIZES["flux2"][0]
    compiled = kopt.compile(model, passes=[probe], lower="eager", dynamic=True)
    with torch.no_grad():
        compiled(**inputs_at("flux2", h, w, t, seed=2))
    notes = compiled.kopt_report.pass_records("size-probe")[0].notes
    assert any("specialized the graph on sizes" in note and "64" in note for note in notes), notes


def test_a_pass_that_bakes_a_size_into_the_graph_is_refused():
    """A pass that copies a symbolic size into a node's arguments (right only for the traced call)
    is skipped with the reason; the model still runs correctly at other sizes."""
    def bakes(graph_module: torch.fx.GraphModule, ctx: kopt.PassContext) -> None:
        graph = graph_module.graph
        x = next(n for n in graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
                 and n.meta["val"].dim() == 3)
        with graph.inserting_after(x):
            view = graph.call_function(torch.ops.aten.reshape.default, (x, list(x.meta["val"].shape)))
        x.replace_all_uses_with(view, delete_user_cb=lambda user: user is not view)
        ctx.fire("bake", view)

    baking = kopt.FunctionPass("bake-sizes", "test", Contract.exact(), bakes)
    model = _model("flux2")
    compiled = kopt.compile(model, passes=[baking], lower="eager", dynamic=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about the raw SymInt too
        for seed, size in enumerate(SIZES["flux2"][:2]):
            inputs = inputs_at("flux2", *size, seed=seed)
            assert rel_err(compiled(**inputs)[0], model(**inputs)[0]) < 1e-6
    status = compiled.kopt_report.pass_records("bake-sizes")[0].status
    assert status.startswith("skipped") and "sym_size" in status


@pytest.mark.parametrize("name", ["qwen-image", "flux2"])
def test_fp8_pipeline_on_symbolic_graphs(name):
    """FP8 passes work on symbolic graphs, except the attention-output quantization, which needs
    the rows each projection reads and declines with that reason."""
    from kopt.fp8 import Fp8Config

    model, sizes = _model(name), SIZES[name]
    compiled = kopt.compile(model, lower="eager", dynamic=True, fp8=Fp8Config(attention=True, min_features=1))
    with torch.no_grad():
        for seed, size in enumerate(sizes[:2]):
            inputs = inputs_at(name, *size, seed=seed)
            assert rel_err(compiled(**inputs)[0], model(**inputs)[0]) < 0.1  # FP8 weights and attention
    report = compiled.kopt_report
    assert len(report.graphs) == 1
    assert report.matches("fp8-linear") >= 17 and report.matches("fp8-attention") == 2
    assert all(not record.status.startswith("skipped") for record in report.graphs[0].passes)
    misses = report.pass_records("fuse-attention-output-quant")[0].near_misses
    assert misses and all("symbolic" in miss.reason for miss in misses)


@pytest.mark.slow
def test_inductor_lowers_one_symbolic_graph_for_every_length():
    """With Inductor: the rewritten FLUX.2 graph is lowered once with symbolic sizes and serves
    two image and text lengths, within contract of a float64 reference."""
    model = _model("flux2")
    reference = copy.deepcopy(model).double()
    compiled = kopt.compile(model, dynamic=True)
    for seed, (h, w, t) in enumerate(SIZES["flux2"][:2]):
        inputs = inputs_at("flux2", h, w, t, seed=30 + seed)
        with torch.no_grad():
            out, exact, eager = compiled(**inputs)[0], reference(**_float64(inputs))[0], model(**inputs)[0]
        assert rel_err(out, exact) <= 2 * rel_err(eager, exact) + 1e-6
    report = compiled.kopt_report
    assert len(report.graphs) == 1 and report.graphs[0].lowering == "inductor" and not report.graphs[0].fallback
    assert report.matches("fuse-qk-norm-rope-real") == 4 and report.graphs[0].memo.misses == 2
