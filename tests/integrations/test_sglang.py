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
    import kopt.api

    def broken(*args, **kwargs):
        raise RuntimeError("kopt cannot build its backend")

    monkeypatch.setattr(kopt.api, "make_backend", broken)
    with caplog.at_level(logging.WARNING, logger="kopt"):
        assert kopt_sglang.with_kopt_backend({"fullgraph": False, "dynamic": None, "mode": MODE}, mode=MODE) is None
    assert "SGLang compiles as usual" in caplog.text
