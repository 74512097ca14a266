"""FP8 producer fusions: the kernels before an FP8 GEMM (activations, adaLN, gated residual) write its
FP8 input and row scales themselves, and change nothing against the unfused FP8 graph; which of them
``"auto"`` runs per scale granularity."""

from __future__ import annotations

import pytest
import torch

import kopt
from kopt.fp8 import Fp8Config
from kopt.passes.fp8.linear import Fp8Linear
from kopt.workloads import get_workload
from tests.test_fp8 import TINY_GATE, _same_output_within_the_gate


@pytest.mark.parametrize("name, matches", [("flux2", {"swiglu-quant": 3}), ("qwen-image", {"gelu-tanh-quant": 3})])
def test_activation_quantization_is_fused_and_changes_nothing(name, matches):
    """FLUX.2 tiny: two feed-forward SwiGLUs and one single-stream [attention, SwiGLU] cat feed FP8
    GEMMs; Qwen-Image tiny: 2 blocks × (image, text) GELU-tanh feed-forwards, less the last block's
    text one, whose output nothing reads (dead code). Fused, the output is the unfused FP8 graph's."""
    workload = get_workload(name)
    torch.manual_seed(0)
    model = workload.model("tiny", dtype=torch.bfloat16)
    config = Fp8Config(min_features=16, gate=TINY_GATE)
    graph_passes = ["redundancy", "sibling-merge", "bias-absorption", "staging"]
    fused = kopt.compile(model, passes=graph_passes, fp8=config, lower="eager")  # adds fuse-activation-quant
    plain = kopt.compile(model, passes=["redundancy", "sibling-merge", Fp8Linear(config), "bias-absorption", "staging"],
                         lower="eager")
    _same_output_within_the_gate(fused, plain, model, workload.inputs("tiny", seed=17, dtype=torch.bfloat16))
    (record,) = fused.kopt_report.pass_records("fuse-activation-quant")
    assert record.matches == matches, record.near_misses


def test_activation_read_elsewhere_is_a_near_miss():
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(32, 16)

        def forward(self, x):
            h = self.up(x)
            y = torch.nn.functional.silu(h[..., :32]) * h[..., 32:]
            return self.down(y), y.sum()

    compiled = kopt.compile(Block(), passes=[], fp8=Fp8Config(min_features=16), lower="eager")
    with torch.no_grad():
        compiled(torch.randn(4, 32))
    (record,) = compiled.kopt_report.pass_records("fuse-activation-quant")
    assert record.total_matches == 0
    assert [m.reason for m in record.near_misses] == ["the SwiGLU output is read elsewhere: it would be computed twice"]


def test_explicitly_named_norm_fusions_are_kept_under_fp8():
    """A pass list the caller wrote is kept as written under fp8=...: the named norm fusion stays
    (and fires), and no fuse-adaln-quant is added to it."""
    workload = get_workload("flux2")
    torch.manual_seed(0)
    model = workload.model("tiny", dtype=torch.bfloat16)
    passes = ["redundancy", "sibling-merge", "bias-absorption", "fuse-adaln", "staging"]
    compiled = kopt.compile(model, passes=passes, fp8=Fp8Config(min_features=16), lower="eager")
    with torch.no_grad():
        compiled(**workload.inputs("tiny", seed=4, dtype=torch.bfloat16))
    names = [p.name for p in compiled.kopt_report.graphs[0].passes]
    assert "fuse-adaln" in names and compiled.kopt_report.matches("fuse-adaln") > 0
    assert "fuse-adaln-quant" not in names


def test_auto_pipeline_per_granularity():
    """Row scales: every producer with an FP8-emitting kernel gets it. Block scales have none, so
    the bf16 norm fusions leave the pipeline and Inductor fuses norm and quantize instead."""
    from kopt.passes.pipeline import resolve

    row = [p.name for p in resolve("auto", Fp8Config())]
    assert row.index("sibling-merge") + 1 == row.index("fp8-linear") == row.index("fuse-activation-quant") - 1
    assert row.index("fuse-gated-residual") + 1 == row.index("fuse-adaln-quant") < row.index("staging")
    block = [p.name for p in resolve("auto", Fp8Config(granularity="block-128x128"))]
    assert "fp8-linear" in block and "fuse-qk-norm-rope" in block
    assert not {"fuse-adaln", "fuse-gated-residual", "fuse-activation-quant", "fuse-adaln-quant"} & set(block)


@pytest.mark.parametrize("name, matches", [("flux2", {"adaln-quant": 4, "gated-residual-quant": 2}),
                                           ("qwen-image", {"adaln-quant": 2, "gated-residual-quant": 6}),
                                           ("ltx-video", {"adaln-quant": 1, "gated-residual-quant": 1})])
def test_norm_kernels_emit_fp8_when_named_and_change_nothing(name, matches):
    """fuse-adaln + fuse-gated-residual + fuse-adaln-quant under fp8=...: every adaLN and gated residual
    feeding an FP8 GEMM writes FP8 itself (LTX-Video's is the ungated cross-attention add before the
    feed-forward); the output is the unfused FP8 graph's."""
    workload = get_workload(name)
    torch.manual_seed(0)
    model = workload.model("tiny", dtype=torch.bfloat16)
    config = Fp8Config(min_features=16, gate=TINY_GATE)
    passes = ["redundancy", "sibling-merge", "bias-absorption", "fuse-adaln", "fuse-gated-residual", "staging"]
    fused = kopt.compile(model, passes=[*passes[:5], "fuse-adaln-quant", "staging"], fp8=config, lower="eager")
    plain = kopt.compile(model, passes=passes, fp8=config, lower="eager")
    _same_output_within_the_gate(fused, plain, model, workload.inputs("tiny", seed=23, dtype=torch.bfloat16))
    (record,) = fused.kopt_report.pass_records("fuse-adaln-quant")
    assert record.matches == matches, record.near_misses


def test_adaln_output_read_elsewhere_is_a_near_miss():
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(32, elementwise_affine=False, eps=1e-6)
            self.proj = torch.nn.Linear(32, 64)

        def forward(self, x, scale, shift):
            m = self.norm(x) * (1 + scale[:, None]) + shift[:, None]
            return self.proj(m), m.sum()

    passes = ["fuse-adaln", "fuse-adaln-quant"]
    compiled = kopt.compile(Block(), passes=passes, fp8=Fp8Config(min_features=16), lower="eager")
    with torch.no_grad():
        compiled(torch.randn(2, 5, 32), torch.randn(2, 32), torch.randn(2, 32))
    report = compiled.kopt_report
    assert report.matches("fuse-adaln") == 1
    (record,) = report.pass_records("fuse-adaln-quant")
    assert record.total_matches == 0
    reasons = [m.reason for m in record.near_misses]
    assert reasons == ["the bf16 adaLN output is read elsewhere: it must still be written"]
