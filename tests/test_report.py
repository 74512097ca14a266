"""The report: per-pass matches, near misses, census and timing; JSON; debug dumps; fuel."""

from __future__ import annotations

import json

import torch

import kopt


def _compile_dit(workload, model, inputs, **kwargs):
    compiled = kopt.compile(model, lower="eager", **kwargs)
    with torch.no_grad():
        compiled(**inputs)
    return compiled


def test_report_lists_each_pass_with_counts_and_timing(tiny_dit):
    """Every pass appears with its why, contract, rule counts, before/after census and time."""
    compiled = _compile_dit(*tiny_dit)
    report = compiled.kopt_report
    record = report.graphs[0].passes[0]
    assert [r.name for r in report.graphs[0].passes] == [p.name for p in kopt.default_pipeline()]
    assert record.name == "redundancy" and record.contract == "exact" and record.why
    assert record.matches["cse"] > 0 and record.total_matches == report.matches("redundancy")
    assert record.after["nodes"] < record.before["nodes"]
    assert record.seconds > 0
    text = str(report)
    assert "redundancy" in text and "fired cse" in text and "nodes" in text
    assert "timestep [diffusion timestep]" in text
    decoded = json.loads(report.to_json())
    assert decoded["graphs"][0]["passes"][0]["matches"]["cse"] == record.matches["cse"]


def test_near_misses_carry_reasons():
    """A rule whose guard declines leaves a near miss naming the node and the reason."""
    rule = kopt.Rule("double", lambda x: x + x, lambda x: x * 2, example=lambda: (torch.randn(4),),
                     why="x + x = 2x", guard=lambda match: "declined for the test")

    class Doubler(torch.nn.Module):
        def forward(self, x):
            return x + x

    compiled = kopt.compile(Doubler(), passes=[kopt.RewritePass("p", "test", kopt.Contract.exact(), [rule])],
                            lower="eager")
    compiled(torch.randn(3))
    (record,) = compiled.kopt_report.graphs[0].passes
    assert record.total_matches == 0 and record.status == "no match"
    (miss,) = record.near_misses
    assert miss.rule == "double" and miss.reason == "declined for the test" and miss.node.startswith("add")
    assert "near miss double" in str(compiled.kopt_report)


def test_debug_dumps_each_pass_before_and_after(tiny_dit, tmp_path, monkeypatch):
    """KOPT_DEBUG=<dir> writes each pass's graph before and after, and its stats."""
    monkeypatch.setenv("KOPT_DEBUG", str(tmp_path))
    _compile_dit(*tiny_dit)
    folder = tmp_path / "graph0"
    before, after = (folder / "00_redundancy_before.txt").read_text(), (folder / "00_redundancy_after.txt").read_text()
    assert ("aten.mm" in before or "aten.addmm" in before) and len(after.splitlines()) < len(before.splitlines())
    stats = json.loads((folder / "00_redundancy_stats.json").read_text())
    assert stats["matches"]["cse"] > 0


def test_fuel_limits_rewrites(tiny_dit, monkeypatch):
    """KOPT_FUEL=N applies N rewrites and reports the rest as out of fuel; output stays exact."""
    workload, model, inputs = tiny_dit
    monkeypatch.setenv("KOPT_FUEL", "3")
    compiled = _compile_dit(workload, model, inputs, passes=["redundancy", "sibling-merge"], verify=True)
    record, merge = compiled.kopt_report.graphs[0].passes
    assert record.matches.get("cse", 0) + record.matches.get("identity-view-or-cast", 0) == 3
    assert any("fuel" in miss.reason for miss in record.near_misses)
    assert merge.total_matches == 0  # no fuel left for it
    with torch.no_grad():
        assert torch.equal(compiled(**inputs)[0], model(**inputs)[0])


def test_progress_is_logged_at_info_for_long_compiles(caplog):
    """The ``kopt`` logger says which step a compile is in (capture, each pass, each lowering), so a
    compile stopped by a time limit shows where it was."""

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.proj(x) * 2 + self.proj(x)

    compiled = kopt.compile(Block(), passes=["redundancy"], lower="eager")
    with caplog.at_level("INFO", logger="kopt"), torch.no_grad():
        compiled(torch.randn(3, 16))
    lines = [r.getMessage() for r in caplog.records if r.name == "kopt"]
    assert any(line.startswith("graph 0: capturing") for line in lines), lines
    assert any(line.startswith("graph 0: redundancy applied (") for line in lines), lines
    assert any(line.startswith("graph 0: lowered in") for line in lines), lines
