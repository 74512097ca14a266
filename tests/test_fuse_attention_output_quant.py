"""The fuse-attention-output-quant pass: the attention kernel writes FP8 for the FP8 projections after
it (the tiny Qwen-Image's text and image projections, a split sequence), within the quality gate and
close to the unfused FP8 graph; a bf16 reader of the output keeps it unfused, with the reason; where
``fp8_pipeline`` puts the pass."""

from __future__ import annotations

import pytest
import torch

import kopt
from kopt.fp8 import Fp8Config, Granularity, QualityGate, measure
from kopt.passes.pipeline import resolve
from tests.conftest import rel_err, tiny_model_and_inputs

TINY_GATE = QualityGate(min_cosine=0.99, min_sqnr_db=18.0)
NAME = "fuse-attention-output-quant"


def _targets(compiled: kopt.KoptModule) -> list[object]:
    """The ops of every rewritten graph (the captured graph module, rewritten in place)."""
    return [n.target for graph in compiled._kopt_backend.compiled for n in graph.captured.graph_module.graph.nodes]


def test_tiny_qwen_image_attention_writes_fp8_for_both_projections():
    _, model, inputs = tiny_model_and_inputs("qwen-image", seed=41, dtype=torch.bfloat16)
    config = Fp8Config(min_features=16, gate=TINY_GATE, attention=True)
    unfused = kopt.compile(model, passes=[p for p in resolve("auto", config) if p.name != NAME],
                           lower="eager")
    fused = kopt.compile(model, fp8=config, lower="eager", verify=True, strict=True)
    with torch.no_grad():
        reference, out = model(**inputs)[0], fused(**inputs)[0]
        assert measure(out, reference, TINY_GATE).passed
        # only the scale of the output's quantization changed: FP8 rounding differences, no more
        assert 0 < rel_err(out, unfused(**inputs)[0]) < 0.02
    (record,) = fused.kopt_report.pass_records(NAME)
    assert record.total_matches == 2 and not record.near_misses
    targets = _targets(fused)
    assert targets.count(torch.ops.kopt.fp8_attention_quant.default) == 2
    assert torch.ops.kopt.fp8_attention.default not in targets


class AttentionThenProjection(torch.nn.Module):
    """Attention whose (B, S, H·D) output is split along the sequence into two projections, and
    optionally also read in bf16."""

    def __init__(self, width: int = 128, head_dim: int = 32, bf16_reader: bool = False) -> None:
        super().__init__()
        self.head_dim, self.bf16_reader = head_dim, bf16_reader
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.first, self.second = torch.nn.Linear(width, width), torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, -1, self.head_dim).transpose(1, 2).chunk(3, dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, -1)
        head, tail = out.split([3, s - 3], dim=1)
        y = torch.cat([self.first(head), self.second(tail)], dim=1)
        return y + out if self.bf16_reader else y


@pytest.mark.parametrize("batch", [1, 2])
def test_split_sequence_into_two_projections(batch):
    module = AttentionThenProjection()
    config = Fp8Config(min_features=16, gate=TINY_GATE, attention=True)
    compiled = kopt.compile(module, fp8=config, lower="eager")
    x = torch.randn(batch, 20, 128)
    with torch.no_grad():
        assert measure(compiled(x), module(x), TINY_GATE).passed
    assert compiled.kopt_report.matches(NAME) == 1


def test_a_bf16_reader_keeps_the_bf16_output():
    module = AttentionThenProjection(bf16_reader=True)
    compiled = kopt.compile(module, fp8=Fp8Config(min_features=16, gate=TINY_GATE, attention=True), lower="eager")
    x = torch.randn(2, 20, 128)
    with torch.no_grad():
        assert measure(compiled(x), module(x), TINY_GATE).passed
    (record,) = compiled.kopt_report.pass_records(NAME)
    assert record.total_matches == 0
    assert any("read in bf16" in miss.reason for miss in record.near_misses), record.near_misses


def test_pipeline_places_it_after_fp8_attention_with_row_scales_only():
    names = [p.name for p in resolve("auto", Fp8Config(attention=True))]
    assert (names.index("fp8-attention") + 1 == names.index(NAME) == names.index("fp8-gemv") - 1
            == names.index("staging") - 2)
    block = resolve("auto", Fp8Config(attention=True, granularity=Granularity.BLOCK_1X128))
    assert NAME not in [p.name for p in block]
    assert NAME not in [p.name for p in resolve("auto", Fp8Config())]
