"""Capture: one graph per tiny model, constants frozen, shapes on every node, roles known."""

from __future__ import annotations

import torch

import kopt
from kopt.config import Role
from kopt.fx.graph_utils import missing_meta


class GraphSpy(kopt.Pass):
    """Keeps the captured graph for inspection; rewrites nothing."""

    name, why, contract = "spy", "test helper", kopt.Contract.exact()

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def apply(self, graph_module, ctx) -> None:
        self.graphs.append(graph_module)


def test_tiny_dit_is_one_graph_without_breaks_and_bit_identical(tiny_dit):
    """passes=[] captures the whole model as one graph and returns exactly eager's output."""
    _workload, model, inputs = tiny_dit
    compiled = kopt.compile(model, passes=[], lower="eager")
    with torch.no_grad():
        reference, output = model(**inputs)[0], compiled(**inputs)[0]
    assert torch.equal(output, reference)
    report = compiled.kopt_report
    assert len(report.graphs) == 1 and report.graph_breaks == []
    assert report.graphs[0].passes == []
    assert "original graph" in report.graphs[0].lowering  # nothing fired: exactly what torch.compile lowers


def test_graph_breaks_are_reported():
    """A model dynamo must split shows two graphs and the break's reason."""
    class Breaks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.a(x)
            torch._dynamo.graph_break()
            return self.b(y)

    model = Breaks().eval()
    compiled = kopt.compile(model, passes=[], lower="eager")
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert torch.equal(compiled(x), model(x))
    report = compiled.kopt_report
    assert len(report.graphs) == 2 and len(report.graph_breaks) >= 1
    assert "graph break" in str(report)


def test_captured_graph_has_frozen_constants_meta_and_roles(tiny_dit):
    """Parameters become get_attr constants; every node has FakeTensor meta; roles are inferred."""
    workload, model, inputs = tiny_dit
    spy = GraphSpy()
    compiled = kopt.compile(model, passes=[spy], lower="eager")
    with torch.no_grad():
        compiled(**inputs)
    (graph_module,) = spy.graphs
    assert missing_meta(graph_module.graph) == []
    constants = [n for n in graph_module.graph.nodes if n.op == "get_attr"]
    assert len(constants) >= sum(1 for _ in model.parameters()) // 2
    placeholder_roles = {n.meta["kopt_source"]: n.meta["kopt_role"]
                         for n in graph_module.graph.nodes if n.op == "placeholder"}
    assert not any("_parameters" in source for source in placeholder_roles)
    roles = {e["argument"]: e["role"] for e in compiled.kopt_report.graphs[0].inputs if e["role"] != "constant"}
    assert roles["timestep"] == "step-invariant"
    assert roles["hidden_states"] == "per-call"
    assert roles["encoder_hidden_states"] == "per-call"
    if workload.name == "flux2":
        assert roles["guidance"] == roles["img_ids"] == roles["txt_ids"] == "step-invariant"


def test_explicit_roles_override_inference():
    """roles= wins over the name rule, and the report says it was given."""
    model = torch.nn.Linear(8, 8).eval()
    compiled = kopt.compile(model, passes=[], lower="eager", roles={"input": Role.STEP_INVARIANT})
    with torch.no_grad():
        compiled(torch.randn(2, 8))
    (entry,) = [e for e in compiled.kopt_report.graphs[0].inputs if e["role"] != "constant"]
    assert entry["role"] == "step-invariant" and entry["reason"] == "given in roles="


def test_invalid_options_fail_at_compile_time():
    """A mistyped pass name or enum value fails immediately with the valid choices."""
    model = torch.nn.Linear(4, 4)
    for kwargs, message in ((dict(passes=["no-such-pass"]), "unknown pass"),
                            (dict(lower="tvm"), "expected one of"),
                            (dict(on_weight_change="maybe"), "expected one of")):
        try:
            kopt.compile(model, **kwargs)
        except ValueError as error:
            assert message in str(error)
        else:
            raise AssertionError(f"{kwargs} was accepted")
