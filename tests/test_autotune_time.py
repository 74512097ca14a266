"""benchmarks/tools/autotune_time.py sums a variant's autotune lines, and only that variant's."""

from benchmarks.tools.autotune_time import autotune_per_variant

LOG = """\
[00:00:01 +   1.0s] m kopt-a: kopt.compile with {...}
[00:00:02 +   2.0s]   kopt: autotune: fp8_attention [b=1,h=2]: 9 configs in 10.5 s, chose BLOCK_M=64
[00:00:03 +   3.0s]   kopt: autotune: activation_quant [rows=8]: 21 configs in 4.25 s, chose BLOCK=4096
[00:00:04 +   4.0s]   m kopt-a forward: median 86.3 ms, compile 20.0 s, vs reference rel_err 0.02
[00:00:05 +   5.0s]   m kopt-a cfg-pair: median 170.0 ms, compile 0.0 s
[00:00:06 +   6.0s] m kopt-b: kopt.compile with {...}
[00:00:07 +   7.0s]   m kopt-b forward: median 90.0 ms, compile 5.0 s
[00:00:08 +   8.0s]   kopt: autotune: fp8_gemv [m=1]: 16 configs in 3.0 s, chose BLOCK_N=16
"""


def test_each_variants_tuning_is_summed_within_its_own_compile():
    rows = autotune_per_variant(LOG)
    assert len(rows) == 1  # kopt-b tuned nothing before its forward; the stray line after it counts nowhere
    row = rows[0]
    assert (row["model"], row["variant"], row["shapes"]) == ("m", "kopt-a", 2)
    assert row["autotune_s"] == 14.75 and row["compile_s"] == 20.0 and row["without_autotune_s"] == 5.25
    assert row["largest"] == ("fp8_attention", 10.5)
