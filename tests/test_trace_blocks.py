"""benchmarks/tools/trace_blocks.py: one block's kernels, and the time outside GEMM and attention."""

from __future__ import annotations

import gzip
import json

from benchmarks.tools.trace_blocks import block, kernels, main, outside_libraries


def _trace() -> dict:
    names = []
    for _ in range(3):  # three blocks: self-attention, GEMM, a fused norm, cross-attention (same kernel, short)
        names += [("cudnn_sdpa_fprop", 1000.0), ("nvjet_gemm", 80.0), ("triton_red_fused_norm", 20.0),
                  ("cudnn_sdpa_fprop", 50.0), ("triton_poi_fused_gelu", 70.0)]
    events, ts = [], 0.0
    for name, dur in names:
        events.append({"cat": "kernel", "name": name, "ts": ts, "dur": dur})
        ts += dur + 1.0
    events.append({"cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 5.0})
    return {"traceEvents": events[::-1]}  # out of order on purpose: kernels() sorts by start


def test_a_block_runs_from_one_long_attention_call_to_the_next():
    span = block(kernels(_trace()), 1)
    assert [e["name"] for e in span] == ["cudnn_sdpa_fprop", "nvjet_gemm", "triton_red_fused_norm",
                                         "cudnn_sdpa_fprop", "triton_poi_fused_gelu"]
    assert span[0]["dur"] == 1000.0  # the short cross-attention call does not start a block


def test_kernels_outside_the_libraries_summed_by_name():
    rest = outside_libraries(kernels(_trace()))
    assert rest == [("triton_poi_fused_gelu", 3, 210.0), ("triton_red_fused_norm", 3, 60.0)]


def test_cli_prints_the_block_and_the_totals(tmp_path, capsys):
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump(_trace(), handle)
    main([str(path), "--block", "0"])
    out = capsys.readouterr().out
    assert "block 0: 5 kernels, 1220.0 µs" in out
    assert "outside GEMM and attention, whole forward: 0.27 ms in 6 kernels" in out
