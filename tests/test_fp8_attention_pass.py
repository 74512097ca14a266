"""The fp8-attention pass: which attentions it takes (the tiny DiTs, with Qwen-Image's key mask),
which it declines and why, where ``Fp8Config(attention=True)`` puts it, and the quality it keeps."""

from __future__ import annotations

import pytest
import torch

import kopt
from kopt.fp8 import Fp8Config, QualityGate, measure
from kopt.passes.pipeline import resolve
from tests.conftest import rel_err, tiny_model_and_inputs

TINY_GATE = QualityGate(min_cosine=0.99, min_sqnr_db=18.0)


@pytest.mark.parametrize("name", ["qwen-image", "flux2"])
def test_tiny_dits_run_every_attention_in_fp8_within_the_gate(name):
    _, model, inputs = tiny_model_and_inputs(name, seed=31, dtype=torch.bfloat16)
    linears_only = kopt.compile(model, fp8=Fp8Config(min_features=16, gate=TINY_GATE), lower="eager")
    with_attention = kopt.compile(model, fp8=Fp8Config(min_features=16, gate=TINY_GATE, attention=True),
                                  lower="eager", verify=True, strict=True)
    with torch.no_grad():
        reference = model(**inputs)[0]
        out = with_attention(**inputs)[0]
        assert measure(out, reference, TINY_GATE).passed
        assert 0 < rel_err(out, linears_only(**inputs)[0]) < 0.05  # the attention's own FP8 rounding
    report = with_attention.kopt_report
    assert report.matches("fp8-attention") == 2 and report.graphs[0].fallback is None
    names = [p.name for p in report.graphs[0].passes]
    assert (names.index("fp8-attention") + 2 == names.index("fuse-attention-output-quant") + 1
            == names.index("fp8-gemv") == names.index("staging") - 1)


def test_qwen_image_mask_is_skipped_on_the_image_keys():
    """The joint mask is cat([text mask, ones]): the op is told that only the 7 text keys of 71 can be
    masked, and computes what it computes with the mask applied everywhere."""
    _, model, inputs = tiny_model_and_inputs("qwen-image", seed=32)
    inputs["encoder_hidden_states_mask"][:, -2:] = 0  # two padded text tokens: the mask matters
    compiled = kopt.compile(model, passes=["fp8-attention"], lower="eager")
    with torch.no_grad():
        out = compiled(**inputs)[0]
        assert rel_err(out, model(**inputs)[0]) < 0.1
    (record,) = compiled.kopt_report.pass_records("fp8-attention")
    assert any("outside keys [0, 7) of 71: 64 keys skip the mask add" in note for note in record.notes), record.notes
    # the joint values cat([text, image]) are read from both parts by the kernel, not copied
    assert any("read their values from two parts" in note for note in record.notes), record.notes
    graph = compiled.kopt_report.graphs[0]
    assert graph.fallback is None


def test_pipeline_adds_the_pass_only_when_asked():
    assert "fp8-attention" not in [p.name for p in resolve("auto", Fp8Config())]
    names = [p.name for p in resolve("auto", Fp8Config(attention=True))]
    assert (names.index("fp8-attention") + 2 == names.index("fuse-attention-output-quant") + 1
            == names.index("fp8-gemv") == names.index("staging") - 1)


class Attention(torch.nn.Module):
    def __init__(self, head_dim: int = 32, causal: bool = False, mask: str | None = None) -> None:
        super().__init__()
        self.head_dim, self.causal, self.mask = head_dim, causal, mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = x.view(b, s, -1, self.head_dim).transpose(1, 2).chunk(3, dim=1)
        mask = None
        if self.mask == "boolean keys":  # capture turns it into an additive (B, 1, 1, S) mask
            mask = x[:, None, None, :, 0] > -1
        elif self.mask == "full":
            mask = x[:, None, :, :1] * x[:, None, None, :, 0]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        return out.transpose(1, 2).reshape(b, s, -1)


@pytest.mark.parametrize("module, width, reason", [
    (Attention(causal=True), 192, "causal attention"),
    (Attention(mask="full"), 192, "only key masks"),
    (Attention(head_dim=48), 288, "head dim 48"),
])
def test_declined_attentions_say_why(module, width, reason):
    compiled = kopt.compile(module, passes=["fp8-attention"], lower="eager")
    x = torch.randn(2, 10, width)
    with torch.no_grad():
        assert torch.equal(compiled(x), module(x))
    (record,) = compiled.kopt_report.pass_records("fp8-attention")
    assert record.total_matches == 0
    assert any(reason in miss.reason for miss in record.near_misses), record.near_misses


@pytest.mark.parametrize("mask", [None, "boolean keys"])
def test_attention_is_replaced_and_close_to_exact(mask):
    module = Attention(mask=mask)
    compiled = kopt.compile(module, passes=["fp8-attention"], lower="eager")
    x = torch.randn(2, 10, 192)
    with torch.no_grad():
        assert rel_err(compiled(x), module(x)) < 0.1
    assert compiled.kopt_report.matches("fp8-attention") == 1
