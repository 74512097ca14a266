"""kopt in SGLang's diffusion runtime (sglang 0.5.23, CPU): the plugin found through SGLang's entry point group,
its hook applied through SGLang's hook registry, kopt's backend in SGLang's compile kwargs only where SGLang would
use Inductor, and the switch / version check / failure rules."""

from __future__ import annotations

import importlib.metadata
import logging

import pytest

pytest.importorskip("sglang.multimodal_gen", reason="SGLang's tests run in their own venv (.ci/engines.sh sglang)")

from sglang.multimodal_gen.runtime.platforms import plugins  # noqa: E402
from sglang.multimodal_gen.runtime.utils import torch_compile  # noqa: E402

from kopt.backend import KoptBackend  # noqa: E402
from kopt.integrations import sglang as kopt_sglang  # noqa: E402

MODE = "max-autotune-no-cudagraphs"  # SGLang's default DiT compile mode


@pytest.fixture(scope="module")
def hooked():
    """SGLang's own plugin loading, as its workers run it: discover, register, apply."""
    plugins.load_plugins()
    plugins.apply_plugin_hooks()
    return torch_compile


def test_entry_point_is_discovered():
    found = importlib.metadata.entry_points(group=plugins.GENERAL_PLUGINS_GROUP)
    assert [ep.value for ep in found if ep.name == "kopt"] == ["kopt.integrations.sglang:register"]


def test_hook_puts_kopt_backend_where_sglang_would_use_inductor(hooked):
    """SGLang's (unmodified) kwargs builder now returns kopt's backend instead of Inductor's mode; the rest of
    SGLang's kwargs are kept, and resolve_torch_compile_kwargs (what DenoisingStage calls) sees the same."""
    kwargs = hooked.build_torch_compile_kwargs(mode=MODE)
    assert isinstance(kwargs["backend"], KoptBackend) and "mode" not in kwargs
    assert kwargs["fullgraph"] is False and kwargs["dynamic"] is None
    resolved, mode = hooked.resolve_torch_compile_kwargs("SGLANG_TORCH_COMPILE_MODE", default=MODE)
    assert isinstance(resolved["backend"], KoptBackend) and mode == MODE


def test_other_backends_and_the_switch_are_left_alone(hooked, monkeypatch):
    """A backend other than Inductor (NPU, out-of-tree platforms) is not touched; KOPT_SGLANG=0 turns kopt off
    at run time and at registration."""
    npu = {"fullgraph": False, "dynamic": False, "backend": "torchair"}
    assert kopt_sglang.with_kopt_backend(dict(npu), mode=None) is None
    monkeypatch.setenv("KOPT_SGLANG", "0")
    assert "backend" not in hooked.build_torch_compile_kwargs(mode=MODE)
    assert kopt_sglang.disabled_reason() == "KOPT_SGLANG=0"


def test_unsupported_version_steps_aside(monkeypatch, caplog):
    monkeypatch.setattr(kopt_sglang, "TESTED", ("0.1", "0.2"))
    with caplog.at_level(logging.WARNING, logger="kopt"):
        kopt_sglang.register()
    assert "steps aside" in caplog.text and "outside the versions" in caplog.text


def test_a_backend_that_cannot_be_built_keeps_sglang_compiling(monkeypatch, caplog):
    """kopt failing inside the hook (here: building its backend) returns SGLang's kwargs unchanged."""
    import kopt.backend

    def broken(*args, **kwargs):
        raise RuntimeError("kopt cannot build its backend")

    monkeypatch.setattr(kopt.backend, "make_backend", broken)
    with caplog.at_level(logging.WARNING, logger="kopt"):
        assert kopt_sglang.with_kopt_backend({"fullgraph": False, "dynamic": None, "mode": MODE}, mode=MODE) is None
    assert "SGLang compiles as usual" in caplog.text


def test_tiny_qwen_image_through_sglangs_compile_path(hooked, monkeypatch):
    """SGLang's own Qwen-Image DiT, compiled by SGLang's unmodified DenoisingStage._maybe_torch_compile with the
    plugin active: kopt's backend compiles it, expands SGLang's fused scale-shift op so kopt's adaLN and
    gated-residual fusions match, and the output keeps the fired passes' contract against a float64 copy of the
    same weights; a second call at the same timestep (the CFG partner) hits the step-invariant memo."""
    import json

    from kopt.integrations.sglang_ops import ExpandSglangOps
    from tests.contracts import assert_within_contract
    from tests.integrations import sglang_cpu

    sglang_cpu.start_runtime()
    monkeypatch.setenv("KOPT_SGLANG_OPTIONS", json.dumps({"lower": "eager", "verify": True}))
    model = sglang_cpu.tiny_qwen_image(seed=0)
    inputs = sglang_cpu.qwen_image_inputs(seed=1)
    eager = sglang_cpu.forward(model, inputs)
    wide = sglang_cpu.forward(sglang_cpu.tiny_qwen_image(seed=0).double(), sglang_cpu.widened(inputs))
    stage = sglang_cpu.denoising_stage()
    stage._maybe_torch_compile(model)
    assert stage._torch_compile_registry.is_compiled(model)
    output = sglang_cpu.forward(model, inputs)

    report = kopt_sglang.LAST_BACKENDS[-1].report
    graph = report.graphs[0]
    matches = {record.name: record.total_matches for record in graph.passes}
    print("SGLang Qwen-Image through kopt:", matches, graph.verification)
    assert graph.fallback is None and matches["expand-sglang-ops"] == 8
    assert matches["fuse-adaln"] == 8 and matches["fuse-gated-residual"] == 6 and matches["staging"] >= 1
    assert_within_contract(output, eager=eager, float64=wide, report=report, passes=[ExpandSglangOps()])

    partner = sglang_cpu.qwen_image_inputs(seed=2)  # other latents and text, same timestep
    sglang_cpu.forward(model, partner)
    assert (graph.memo.misses, graph.memo.hits) == (1, 1)


def test_tiny_flux2_through_sglangs_compile_path(hooked, monkeypatch):
    """SGLang's own FLUX.2 DiT through SGLang's unmodified compile path: SGLang's code breaks the graph (data
    pointer comparisons), and kopt compiles each piece (adaLN and gated-residual fusions fire, the timestep
    stage is staged; pieces dynamo made symbolic are captured with their symbols); a piece that hands an empty
    buffer to the next one passes verification on its shape and dtype; the output keeps the fired passes'
    contract against float64."""
    import json

    from kopt.integrations.sglang_ops import ExpandSglangOps
    from tests.contracts import assert_within_contract
    from tests.integrations import sglang_cpu

    sglang_cpu.start_runtime()
    monkeypatch.setenv("KOPT_SGLANG_OPTIONS", json.dumps({"lower": "eager", "verify": True}))
    model = sglang_cpu.tiny_flux2(seed=0)
    inputs = sglang_cpu.flux2_inputs(model, seed=1)
    eager = sglang_cpu.forward(model, inputs)
    wide = sglang_cpu.forward(sglang_cpu.tiny_flux2(seed=0).double(), sglang_cpu.widened(inputs))
    sglang_cpu.denoising_stage()._maybe_torch_compile(model)
    output = sglang_cpu.forward(model, inputs)

    report = kopt_sglang.LAST_BACKENDS[-1].report
    fired: dict[str, int] = {}
    for graph in report.graphs:
        for record in graph.passes:
            fired[record.name] = fired.get(record.name, 0) + record.total_matches
    fallbacks = [graph.fallback for graph in report.graphs if graph.fallback]
    print(f"SGLang FLUX.2 through kopt: {len(report.graphs)} graphs, {fired}, fallbacks {fallbacks}")
    assert fired["fuse-adaln"] >= 4 and fired["fuse-gated-residual"] >= 2 and fired["staging"] >= 1
    assert not fallbacks
    assert all(check["ok"] for graph in report.graphs for check in graph.verification)
    assert_within_contract(output, eager=eager, float64=wide, report=report, passes=[ExpandSglangOps()])


def test_sglang_ops_without_an_expansion_are_reported(hooked):
    """The CPU scale-shift op is expanded; an SGLang op kopt has no expansion for (its Triton RMSNorm, registered
    by SGLang's layernorm module) stays in the graph, and the report names it."""
    import sglang.multimodal_gen.runtime.layers.layernorm  # noqa: F401  (registers sglang::triton_one_pass_rms_norm_cuda)
    import torch

    from kopt.integrations.sglang_ops import ExpandSglangOps
    from kopt.passes.manager import run_passes
    from tests.integrations import sglang_cpu

    sglang_cpu.start_runtime()

    def body(x, scale, shift, weight):
        modulated = torch.ops.sgl_kernel.fused_scale_shift_cpu(x, scale, shift, 1.0)
        return torch.ops.sglang.triton_one_pass_rms_norm_cuda(modulated, weight, 1e-6)

    from kopt.fx.capture import trace_function

    graph_module = trace_function(body, torch.randn(1, 4, 8), torch.randn(1, 1, 8), torch.randn(1, 1, 8),
                                  torch.ones(8))
    record = run_passes(graph_module, [ExpandSglangOps()])[0]
    assert record.matches == {"scale-shift": 1}
    assert "sgl_kernel" not in str(graph_module.graph) and "triton_one_pass_rms_norm_cuda" in str(graph_module.graph)
    assert any("sglang.triton_one_pass_rms_norm_cuda.default" in note for note in record.notes)
