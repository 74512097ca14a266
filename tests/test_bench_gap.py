"""benchmarks/dit/gap.py: kopt's kernel time against its best baseline's, per category and library kernel."""

from __future__ import annotations

import json

from benchmarks.dit.gap import compare, main, pairs, report


def _breakdown(variant: str, gemm: float, attention: float, rest: float, gap: float,
               top: list[tuple[str, str, float, int]]) -> dict:
    return {"model": "m", "variant": variant, "call": "forward", "gap_ms": gap,
            "ms": {"gemm": gemm, "attention": attention, "norm_elementwise": rest, "copies": 0.5, "other": 0.0},
            "kernel_ms": gemm + attention + rest + 0.5,
            "top": [{"name": n, "category": c, "ms": ms, "calls_per_forward": calls} for n, c, ms, calls in top]}


def _results() -> dict:
    rows = [{"model": "m", "variant": v, "call": "forward", "median_ms": ms}
            for v, ms in (("torch.compile", 104.0), ("torch.compile+graphs", 100.0), ("kopt-regional", 95.0))]
    return {"rows": rows, "breakdown": [
        _breakdown("torch.compile+graphs", 50.0, 30.0, 15.0, 4.5,
                   [("gemm_a", "gemm", 40.0, 10), ("attn", "attention", 30.0, 4), ("gemm_b", "gemm", 10.0, 6)]),
        _breakdown("kopt-regional", 52.0, 31.0, 13.0, -1.5,
                   [("gemm_a", "gemm", 45.0, 7), ("attn", "attention", 31.0, 4),
                    ("fused", "norm_elementwise", 13.0, 8)]),
    ]}


def test_compares_against_the_fastest_baseline_of_the_precision():
    assert pairs(_results(), None) == [("m", "kopt-regional", "torch.compile+graphs")]
    assert pairs(_results(), "torch.compile") == [("m", "kopt-regional", "torch.compile")]


def test_library_excess_and_what_kopt_would_gain_without_it():
    c = compare(_results(), "m", "kopt-regional", "torch.compile+graphs")
    assert c["categories"]["gemm"] == (50.0, 52.0) and c["categories"]["host gap"] == (4.5, -1.5)
    assert c["library_excess_ms"] == 3.0  # +2 GEMM, +1 attention
    assert abs(c["gain_pct"] - 5.0) < 1e-9
    assert abs(c["gain_with_their_library_pct"] - 8.0) < 1e-9  # (100 - (95 - 3)) / 100
    assert abs(c["overlap_ms"] - 1.5) < 1e-9  # 96.5 ms of kernels in a 95 ms forward
    names = {s["name"]: s for s in c["shared"]}
    assert set(names) == {"gemm_a", "attn"}  # only library kernels present in both
    assert (names["gemm_a"]["baseline_calls"], names["gemm_a"]["kopt_calls"]) == (10, 7)


def test_report_marks_other_shapes_and_overlap():
    text = report(_results())
    assert "| gemm_a | 10 / 7 | 40.00 | 45.00 | – (other shapes) |" in text
    assert "| attn | 4 / 4 | 30.00 | 31.00 | +1.00 |" in text
    assert "kopt would be +8.0 % faster" in text
    assert "1.50 ms more than its median" in text


def test_a_row_without_a_profile_is_named_not_compared():
    results = _results()
    results["breakdown"] = results["breakdown"][:1]
    assert compare(results, "m", "kopt-regional", "torch.compile+graphs") is None
    assert "has no profiled forward" in report(results)


def test_gemm_rates_and_what_is_left_to_cut_for_the_goal(tmp_path):
    """Rates from the counted GEMM FLOPs (eager's too, where profiled); the goal's remaining cut
    against kopt's time outside GEMM and attention, with the largest kernels there."""
    results = _results()
    results["per_model"] = {"m": {"flops": {"gemm": 26e12}}}  # 26 TFLOP per forward
    results["breakdown"].append(_breakdown("eager", 40.0, 30.0, 20.0, 1.0, []))
    c = compare(results, "m", "kopt-regional", "torch.compile+graphs")
    rates = c["gemm_tflops"]
    assert {k: round(v, 6) for k, v in rates.items()} == {"baseline": 520.0, "kopt": 500.0, "eager": 650.0}
    assert c["goal_pct"] == 5.0 and abs(c["to_cut_ms"] - 0.0) < 1e-9  # 95 = 0.95 x 100: just met
    assert abs(c["outside_library_ms"] - 13.5) < 1e-9 and c["largest_outside"] == [("fused", 13.0)]
    results["rows"][2]["median_ms"] = 97.0
    c = compare(results, "m", "kopt-regional", "torch.compile+graphs")
    assert abs(c["to_cut_ms"] - 2.0) < 1e-9
    text = report(results)
    assert "TFLOP/s: baseline 520, kopt 500, eager 650" in text and "must cut 2.00 ms more" in text
    path = tmp_path / "r.json"
    path.write_text(json.dumps(results))
    main([str(path), str(path), "--out", str(tmp_path / "gaps")])
    written = (tmp_path / "gaps.md").read_text()
    assert written.count("# r.json") == 2 and "must cut 2.00 ms more" in written


def test_the_rows_clocks_are_reported_beside_the_kernel_times():
    """Where the run recorded each row's SM clock (benchmarks/dit/device_state.py), the section says
    how much lower kopt's ran; without them it says nothing about clocks."""
    results = _results()
    assert "SM clock" not in report(results)
    for row, (mhz, watts) in zip(results["rows"][1:], ((1830.0, 640.0), (1755.0, 699.0)), strict=True):
        row.update(sm_clock_mhz=mhz, power_w=watts)
    text = report(results)
    assert "SM clock over the timed calls: baseline 1830 MHz at 640 W, kopt 1755 MHz at 699 W (-4.1 %" in text
