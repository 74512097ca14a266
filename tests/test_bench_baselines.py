"""The replaying baselines and the best-baseline summary: kopt is compared with the fastest thing a
user could run, credited with CUDA-graph replay when kopt replays."""

from __future__ import annotations

import pytest
import torch

from benchmarks.dit.graph_replay import ReplayedForward
from benchmarks.dit.summary import best_baselines, summary_rows
from benchmarks.dit.variants import Setup, select


def _row(variant: str, ms: float, replay: str | None = None, call: str = "forward") -> dict:
    return dict(model="m", variant=variant, call=call, status="ok", median_ms=ms, replay=replay)


def _breakdown(variant: str, kernel_ms: float) -> dict:
    return dict(model="m", variant=variant, call="forward", kernel_ms=kernel_ms)


def test_a_baseline_that_could_not_be_captured_is_credited_with_its_kernel_time() -> None:
    """An uncapturable forward's best possible replay is its summed kernel time, never its slower median."""
    results = {"rows": [_row("torch.compile", 140.0), _row("torch.compile+graphs", 141.0, "not replayed: host copy"),
                        _row("kopt", 120.0, "replayed")],
               "breakdown": [_breakdown("torch.compile+graphs", 118.0)]}
    best = best_baselines(results)[("m", "forward", "bf16")]
    assert best["variant"] == "torch.compile+graphs" and best["ms"] == 118.0
    assert best["how"].startswith("replay bound")
    (row,) = summary_rows(results)
    assert row["gain_pct"] == pytest.approx(100 * (118.0 - 120.0) / 118.0, abs=0.01)  # kopt loses here


def test_a_replayed_baseline_competes_with_its_median_and_precisions_stay_apart() -> None:
    results = {"rows": [_row("torch.compile", 140.0), _row("torch.compile+graphs", 130.0, "replayed"),
                        _row("fp8+torch.compile-fast-accum+graphs", 90.0, "replayed"),
                        _row("kopt", 120.0, "replayed"), _row("kopt-fp8-attn", 80.0, "replayed")],
               "breakdown": [_breakdown("torch.compile+graphs", 100.0)]}
    rows = {r["variant"]: r for r in summary_rows(results)}
    assert rows["kopt"]["baseline"] == "torch.compile+graphs" and rows["kopt"]["baseline_ms"] == 130.0
    assert rows["kopt-fp8-attn"]["baseline"] == "fp8+torch.compile-fast-accum+graphs"
    assert rows["kopt-fp8-attn"]["gain_pct"] == pytest.approx(100 * 10 / 90, abs=0.01)


def test_failed_baseline_rows_are_not_candidates() -> None:
    results = {"rows": [dict(_row("torch.compile+graphs", None), status="error: boom"), _row("kopt", 120.0)],
               "breakdown": []}
    (row,) = summary_rows(results)
    assert row["baseline"] is None and row["gain_pct"] is None


def test_replayed_variants_exist_and_run_last_when_they_mutate() -> None:
    names = [v.name for v in select("fp8+graphs,kopt,compile+graphs", "full", False)]
    assert names == ["kopt", "torch.compile+graphs", "fp8+torch.compile-fast-accum+graphs"]


def test_on_the_cpu_replay_is_reported_as_not_replayed_and_outputs_are_unchanged() -> None:
    linear = torch.nn.Linear(8, 8)
    replayed = ReplayedForward(lambda x, scale: linear(x) * scale)
    x = torch.randn(3, 8)
    for _ in range(4):
        assert torch.allclose(replayed(x=x, scale=2.0), linear(x) * 2.0)
    assert not replayed.replayed and replayed.status().startswith("not replayed")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_compiled_forward_is_replayed_from_one_graph_with_fresh_inputs() -> None:
    linear = torch.nn.Linear(64, 64, device="cuda")
    compiled = torch.compile(lambda x, scale: torch.relu(linear(x)) * scale)
    replayed = ReplayedForward(compiled)
    for _ in range(5):
        x = torch.randn(16, 64, device="cuda")
        expected = torch.relu(x.double() @ linear.weight.double().T + linear.bias.double()) * 3.0
        out = replayed(x=x, scale=3.0)
        assert ((out.double() - expected).norm() / expected.norm()).item() < 1e-2
    assert replayed.replayed, replayed.status()


def test_setup_is_unchanged_by_the_replay_variant_on_cpu() -> None:
    from benchmarks.dit.variants import Prepared, _replayed

    prepared = _replayed(Prepared(lambda **kw: kw), Setup("tiny", torch.device("cpu"), torch.float32))
    assert prepared.replay is not None and prepared.replay() == "not replayed: CPU"


def test_the_summary_carries_cold_and_warm_compile_time_and_peak_memory_against_eager() -> None:
    from benchmarks.dit.summary import summary_table

    rows = [dict(_row("eager", 170.0), peak_gb=24.0),
            dict(_row("torch.compile+graphs", 130.0, "replayed"), compile_s=10.0, warm_compile_s=4.0, peak_gb=24.5),
            dict(_row("kopt", 120.0, "replayed"), compile_s=60.0, warm_compile_s=30.0, peak_gb=26.4),
            dict(_row("kopt", 240.0, "replayed", call="cfg-pair"), compile_s=0.0, peak_gb=26.0)]
    forward, pair = summary_rows({"rows": rows, "breakdown": []})
    assert (forward["kopt_compile_s"], forward["kopt_warm_compile_s"]) == (60.0, 30.0)
    assert (forward["baseline_compile_s"], forward["baseline_warm_compile_s"]) == (10.0, 4.0)
    assert forward["peak_vs_eager"] == pytest.approx(1.1)
    table = summary_table({"rows": rows, "breakdown": []})
    assert "| 60.0 (30.0) | 10.0 (4.0) | 1.10× |" in table
    assert pair["call"] == "cfg-pair" and "| – | – | – |" in table.splitlines()[-1]


def test_the_budget_scales_full_size_estimates_by_the_pace_of_this_run() -> None:
    """A model whose variants ran in a quarter of their estimates gets a quarter of the next estimate;
    before any ran the estimate stands; the factor is bounded both ways."""
    from benchmarks.dit.dit import pace_factor

    assert pace_factor([]) == 1.0
    assert pace_factor([(150.0, 30.0), (120.0, 37.5)]) == pytest.approx(0.25)
    assert pace_factor([(100.0, 1.0)]) == 0.1 and pace_factor([(10.0, 100.0)]) == 3.0
