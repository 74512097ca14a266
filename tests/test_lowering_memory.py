"""A lowering check that passed is remembered across processes (``kopt/lowering_memory.py``): the
same graph, layout, device and versions are not checked again; anything that changes the lowered
code is."""

from __future__ import annotations

import torch

import kopt
from kopt import lowering_memory

SETTINGS = {"mode": "default", "patches": {}, "inductor": "h"}


def _mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()


def _check(model: torch.nn.Module, x: torch.Tensor):
    torch._dynamo.reset()
    compiled = kopt.compile(model, lower="inductor", progress=False)
    with torch.no_grad():
        got = compiled(x)
        expected = model(x)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5)
    (graph,) = compiled.kopt_report.graphs
    return graph.lowering_check


def test_a_passed_check_is_trusted_for_the_same_code_and_redone_when_it_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("KOPT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(lowering_memory.RECHECK_ENV, raising=False)  # the suite checks everything (conftest)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    first = _check(_mlp(0), x)
    assert first.ok and first.outputs and not first.note  # judged against the reference
    assert len(list((tmp_path / "lowering").glob("*.json"))) == 1
    again = _check(_mlp(5), torch.randn(4, 16))  # other weights and values, same code
    assert again.ok and not again.outputs and "passed before" in again.note
    other_shape = _check(_mlp(0), torch.randn(6, 16))  # another layout: other code, checked
    assert other_shape.outputs and other_shape.ok
    monkeypatch.setenv(lowering_memory.RECHECK_ENV, "1")
    forced = _check(_mlp(0), x)
    assert forced.outputs and forced.ok


def test_the_key_changes_with_everything_that_decides_the_lowered_code():
    a = torch.randn(4, 16)
    base = lowering_memory.verdict_key("code", [a], "inductor", SETTINGS)
    assert base == lowering_memory.verdict_key("code", [torch.randn(4, 16)], "inductor", SETTINGS)
    changed = [
        lowering_memory.verdict_key("other code", [a], "inductor", SETTINGS),
        lowering_memory.verdict_key("code", [torch.randn(4, 17)], "inductor", SETTINGS),
        lowering_memory.verdict_key("code", [a.double()], "inductor", SETTINGS),
        lowering_memory.verdict_key("code", [a.t().contiguous().t()], "inductor", SETTINGS),  # strides
        lowering_memory.verdict_key("code", [a], "eager", SETTINGS),
        lowering_memory.verdict_key("code", [a], "inductor", {**SETTINGS, "inductor": "other"}),
    ]
    assert base not in changed and len(set(changed)) == len(changed)


def test_the_inductor_configuration_is_part_of_the_settings():
    plain = lowering_memory.lowering_settings("default", {})
    with torch._inductor.config.patch(coordinate_descent_tuning=True):
        patched = lowering_memory.lowering_settings("default", {})
    assert plain != patched and plain == lowering_memory.lowering_settings("default", {})


def test_a_graph_checked_again_says_which_part_of_its_key_changed(tmp_path, monkeypatch, caplog):
    """A warm compile that checks a graph again names what differs from the last passed check of the
    same graph text (here Inductor's configuration, then the inputs' layout); a graph never checked
    before gets no such line."""
    import logging

    monkeypatch.setenv("KOPT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(lowering_memory.RECHECK_ENV, raising=False)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))
    with caplog.at_level(logging.INFO, logger="kopt"):
        _check(_mlp(0), x)
        assert "checking the lowering again" not in caplog.text
        with torch._inductor.config.patch(coordinate_descent_tuning=True):
            again = _check(_mlp(0), x)
    assert again.outputs and again.ok  # judged again, not trusted
    assert "a check of this graph text passed before, with another options" in caplog.text
    parts = lowering_memory.key_parts("code", [x], "inductor", SETTINGS)
    assert lowering_memory.why_not_remembered(parts) is None  # this graph text never passed here
    lowering_memory.remember(lowering_memory.key_of(parts), 0.1, 1, parts)
    wider = lowering_memory.key_parts("code", [torch.randn(4, 17)], "inductor", SETTINGS)
    assert lowering_memory.why_not_remembered(wider) == "arguments"
    assert lowering_memory.remembered(lowering_memory.key_of(parts)) is not None
