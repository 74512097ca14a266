"""benchmarks/dit/gap.py: kopt's kernel time against its best baseline's, per category and library kernel."""

from __future__ import annotations

from benchmarks.dit.gap import compare, pairs, report


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
