"""Gated-residual fusion: r + gate * y (or a plain r + y) feeding an adaLN becomes one kopt op with two outputs."""

from __future__ import annotations

import copy

import pytest
import torch

import kopt
from kopt.fx.capture import trace_function
from kopt.passes.fuse.adaln import FuseAdaLN
from kopt.passes.fuse.gated_residual import FuseGatedResidual
from kopt.passes.manager import run_passes
from tests.conftest import rel_err

PIPELINE = ["redundancy", "sibling-merge", "bias-absorption", "fuse-adaln", "fuse-gated-residual", "staging"]
EXPECTED = {"qwen-image": 6, "flux2": 2}  # every block boundary where the next adaLN reads r + gate * y


def test_fires_on_tiny_dits_and_matches_eager(tiny_dit):
    workload, model, inputs = tiny_dit
    compiled = kopt.compile(model, passes=PIPELINE, lower="eager", verify=True)
    with torch.no_grad():
        assert rel_err(compiled(**inputs)[0], model(**inputs)[0]) < 1e-5
    record = compiled.kopt_report.pass_records("fuse-gated-residual")[0]
    assert record.matches == {"gated-residual": EXPECTED[workload.name]}
    assert compiled.kopt_report.graphs[0].fallback is None


def _block_boundary(r, y, gate, scale, shift):
    r_new = r + gate[:, None] * y
    m = torch.nn.functional.layer_norm(r_new, (r.shape[-1],), eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
    return r_new * 2, m  # the new residual has another reader


def test_golden_one_op_feeds_both_readers():
    args = [torch.randn(2, 5, 24), torch.randn(2, 5, 24), torch.randn(2, 24), torch.randn(2, 24), torch.randn(2, 24)]
    graph_module = trace_function(_block_boundary, *args)
    records = run_passes(graph_module, [FuseAdaLN(), FuseGatedResidual()], strict=True)
    assert records[1].matches == {"gated-residual": 1}
    ops = [n.target for n in graph_module.graph.nodes if n.op == "call_function"]
    assert torch.ops.kopt.gated_residual.default in ops
    assert torch.ops.kopt.adaln_modulation.default not in ops and torch.ops.aten.add.Tensor not in ops
    fresh = [torch.randn_like(a) for a in args]
    for got, want in zip(graph_module(*fresh), _block_boundary(*fresh), strict=True):
        assert rel_err(got, want) < 1e-6


def _chain_of_blocks(r, ys, gates, scale, shift):
    """Four block boundaries in a row, each residual the previous boundary's new residual."""
    outs = []
    for i in range(4):
        r = r + gates[:, i, None] * ys[i]
        outs.append(torch.nn.functional.layer_norm(r, (r.shape[-1],), eps=1e-6) * (1 + scale[:, None]) + shift[:, None])
    return r, *outs


def test_every_boundary_of_a_chain_fuses():
    """A rewritten boundary's residual output feeds the next boundary: the fused op's outputs carry
    shapes, so the next match sees them (it used to miss every other boundary: 2 of 4)."""
    args = [torch.randn(2, 5, 24), torch.randn(4, 2, 5, 24), torch.randn(2, 4, 24), torch.randn(2, 24),
            torch.randn(2, 24)]
    graph_module = trace_function(_chain_of_blocks, *args)
    records = run_passes(graph_module, [FuseAdaLN(), FuseGatedResidual()], strict=True)
    assert records[1].matches == {"gated-residual": 4}
    ops = [n.target for n in graph_module.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.add.Tensor not in ops and torch.ops.kopt.adaln_modulation.default not in ops
    fresh = [torch.randn_like(a) for a in args]
    for got, want in zip(graph_module(*fresh), _chain_of_blocks(*fresh), strict=True):
        assert rel_err(got, want) < 1e-5


def _rms_boundary(r, y, gate, scale, shift):
    r_new = r + gate[:, None] * y
    normed = r_new * torch.rsqrt(r_new.pow(2).mean(-1, keepdim=True) + 1e-6)  # RMSNorm as DiTs spell it
    return r_new * 2, normed * (1 + scale[:, None]) + shift[:, None]


def test_a_reader_before_the_modulation_inputs_still_fuses():
    """r_new read before scale[:, None] is computed: the scale and shift views move up with the fused
    op (they do not depend on r_new), so every reader comes after it."""
    def early_reader(r, y, gate, scale, shift):
        r_new = r + gate[:, None] * y
        doubled = r_new * 2
        normed = r_new * torch.rsqrt(r_new.pow(2).mean(-1, keepdim=True) + 1e-6)
        return doubled, normed * (1 + scale[:, None]) + shift[:, None]

    args = [torch.randn(2, 5, 24), torch.randn(2, 5, 24), torch.randn(2, 24), torch.randn(2, 24), torch.randn(2, 24)]
    graph_module = trace_function(early_reader, *args)
    records = run_passes(graph_module, [FuseAdaLN(), FuseGatedResidual()], strict=True)
    assert records[1].matches == {"gated-residual": 1}, records[1].near_misses
    fresh = [torch.randn(2, 5, 24) for _ in range(2)] + [torch.randn(2, 24) for _ in range(3)]
    for got, exact in zip(graph_module(*fresh), early_reader(*(t.double() for t in fresh)), strict=True):
        assert rel_err(got, exact) < 1e-5


def test_a_scale_computed_from_the_residual_is_declined():
    def self_modulated(r, y, gate, shift):
        r_new = r + gate[:, None] * y
        scale = r_new.mean(1)  # depends on r_new: the fused op cannot compute it first
        normed = torch.nn.functional.layer_norm(r_new, (24,), eps=1e-6)
        return normed * (1 + scale[:, None]) + shift[:, None]

    args = [torch.randn(2, 5, 24), torch.randn(2, 5, 24), torch.randn(2, 24), torch.randn(2, 24)]
    graph_module = trace_function(self_modulated, *args)
    records = run_passes(graph_module, [FuseAdaLN(), FuseGatedResidual()], strict=False)
    assert records[1].total_matches == 0


def test_rms_norm_boundary_fuses_with_the_rms_flag():
    """LTX-Video's seam: r + gate * y read by an RMSNorm without weight, then modulated; checked against
    float64 on fresh inputs."""
    args = [torch.randn(2, 5, 24), torch.randn(2, 5, 24), torch.randn(2, 24), torch.randn(2, 24), torch.randn(2, 24)]
    graph_module = trace_function(_rms_boundary, *args)
    records = run_passes(graph_module, [FuseAdaLN(), FuseGatedResidual()], strict=True)
    assert records[1].matches == {"gated-residual": 1}, records[1].near_misses
    (fused,) = [n for n in graph_module.graph.nodes if n.target is torch.ops.kopt.gated_residual.default]
    assert fused.args[6] is True
    fresh = [torch.randn(2, 5, 24) * 2, torch.randn(2, 5, 24), torch.randn(2, 24), torch.randn(2, 24) * 0.3,
             torch.randn(2, 24)]
    want = _rms_boundary(*(t.double() for t in fresh))
    for got, exact in zip(graph_module(*fresh), want, strict=True):
        assert rel_err(got, exact) < 1e-5


def _gated_residual_ops(graph_module: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in graph_module.graph.nodes if n.target is torch.ops.kopt.gated_residual.default]


def test_every_block_boundary_of_tiny_ltx_video_fuses():
    """Each block's feed-forward residual feeds the next block's RMSNorm (the last one the output
    LayerNorm) and its ungated cross-attention residual feeds its own norm2: two fused seams per block,
    counted as kopt::gated_residual ops just before and after the pass."""
    from kopt.passes.base import Contract, FunctionPass
    from tests.conftest import tiny_with_more_blocks

    workload, model = tiny_with_more_blocks("ltx-video", extra=1)
    inputs = workload.inputs("tiny", seed=5)
    counts: dict[str, tuple[int, int]] = {}

    def counter(name: str) -> FunctionPass:
        def count(graph_module: torch.fx.GraphModule, _ctx: object) -> None:
            ops = _gated_residual_ops(graph_module)
            counts[name] = (len(ops), sum(op.args[2] is None for op in ops))  # (all, ungated)
        return FunctionPass(f"count-{name}", "test probe", Contract.exact(), count)

    at = PIPELINE.index("fuse-gated-residual")
    passes = [*PIPELINE[:at], counter("before"), PIPELINE[at], counter("after"), *PIPELINE[at + 1:]]
    compiled = kopt.compile(model, passes=passes, lower="eager", verify=True)
    with torch.no_grad():
        assert rel_err(compiled(**inputs)[0], model(**inputs)[0]) < 1e-5
    blocks = len(model.transformer_blocks)
    assert blocks == 2
    record = compiled.kopt_report.pass_records("fuse-gated-residual")[0]
    assert record.matches == {"gated-residual": blocks, "plain-residual": blocks}, record.near_misses
    assert counts == {"before": (0, 0), "after": (2 * blocks, blocks)}


class LtxCrossAttentionSeam(torch.nn.Module):
    """LTX-Video's block from the cross-attention on: ``r + attn2(r, context)`` with no gate, then the
    weightless RMSNorm ``norm2``, ``* (1 + scale) + shift``, the feed-forward and its gated residual
    (a stand-in attention: a projection of r plus a projection of the pooled context)."""

    def __init__(self, width: int = 40) -> None:
        from diffusers.models.normalization import RMSNorm

        super().__init__()
        self.to_q, self.to_out = torch.nn.Linear(width, width), torch.nn.Linear(width, width)
        self.norm2 = RMSNorm(width, eps=1e-6, elementwise_affine=False)
        self.ff = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(approximate="tanh"),
                                      torch.nn.Linear(2 * width, width))
        self.mod = torch.nn.Linear(width, 3 * width)

    def forward(self, r: torch.Tensor, context: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.mod(emb)[:, None].chunk(3, dim=-1)
        attn_out = self.to_out(torch.tanh(self.to_q(r)) + context.mean(1, keepdim=True))
        r = r + attn_out
        m = self.norm2(r) * (1 + scale) + shift
        return r + self.ff(m) * gate


def _seam_inputs(g: torch.Generator, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    shapes = ((2, 9, 40), (2, 5, 40), (2, 40))
    return tuple((torch.randn(*shape, generator=g) * 2).to(dtype) for shape in shapes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ltx_cross_attention_add_fuses_without_a_gate(dtype):
    """The ungated add before norm2 becomes one kopt::gated_residual with gate None; on fresh inputs the
    output matches a float32 run of the same weights within the pass's 1e-2 contract."""
    torch.manual_seed(0)
    reference_model = LtxCrossAttentionSeam().eval()
    model = copy.deepcopy(reference_model).to(dtype)
    compiled = kopt.compile(model, passes=PIPELINE, lower="eager", verify=True, progress=False)
    g = torch.Generator().manual_seed(int(torch.randint(1 << 30, ())))
    for _ in range(2):  # fresh inputs after the compile's own
        inputs = _seam_inputs(g, dtype)
        with torch.no_grad():
            got, want = compiled(*inputs), reference_model(*(t.float() for t in inputs))
        assert got.dtype == dtype and want.abs().mean() > 0.1
        assert rel_err(got, want) < (1e-5 if dtype == torch.float32 else 1e-2)
    record = compiled.kopt_report.pass_records("fuse-gated-residual")[0]
    assert record.matches == {"plain-residual": 1}, record.near_misses
    assert compiled.kopt_report.graphs[0].fallback is None


def _plain_boundary(r, y, scale, shift, swap=False):
    r_new = y + r if swap else r + y
    normed = r_new * torch.rsqrt(r_new.pow(2).mean(-1, keepdim=True) + 1e-6)
    return r_new * 2, normed * (1 + scale[:, None]) + shift[:, None]


@pytest.mark.parametrize("swap", [False, True])
def test_golden_plain_add_in_either_order_becomes_an_ungated_op(swap):
    """``r + y`` or ``y + r`` feeding the RMSNorm + modulation: one op, gate None, no add left; against
    float64 on fresh inputs."""
    args = [torch.randn(2, 5, 24), torch.randn(2, 5, 24), torch.randn(2, 24), torch.randn(2, 24)]
    graph_module = trace_function(lambda *a: _plain_boundary(*a, swap=swap), *args)
    records = run_passes(graph_module, [FuseAdaLN(), FuseGatedResidual()], strict=True)
    assert records[1].matches == {"plain-residual": 1}, records[1].near_misses
    (fused,) = _gated_residual_ops(graph_module)
    assert fused.args[2] is None and fused.args[6] is True
    ops = [n.target for n in graph_module.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.add.Tensor not in ops and torch.ops.kopt.adaln_modulation.default not in ops
    fresh = [torch.randn(2, 5, 24) * 2, torch.randn(2, 5, 24), torch.randn(2, 24) * 0.3, torch.randn(2, 24)]
    for got, exact in zip(graph_module(*fresh), _plain_boundary(*(t.double() for t in fresh)), strict=True):
        assert rel_err(got, exact) < 1e-5


@pytest.mark.parametrize("y_shape,y_dtype", [((2, 1, 24), torch.bfloat16), ((2, 5, 24), torch.float32)])
def test_a_plain_add_of_differing_shapes_or_dtypes_is_declined(y_shape, y_dtype):
    """A broadcast operand (B, 1, N), or one of another dtype (the sum is promoted), is not r + y."""
    def boundary(r, y, scale, shift):
        r_new = r + y
        normed = r_new * torch.rsqrt(r_new.pow(2).mean(-1, keepdim=True) + 1e-6)
        return normed * (1 + scale[:, None]) + shift[:, None]

    args = [torch.randn(2, 5, 24, dtype=torch.bfloat16), torch.randn(y_shape, dtype=y_dtype),
            torch.randn(2, 24, dtype=torch.bfloat16), torch.randn(2, 24, dtype=torch.bfloat16)]
    graph_module = trace_function(boundary, *args)
    records = run_passes(graph_module, [FuseAdaLN(), FuseGatedResidual()], strict=True)
    assert records[0].total_matches == 1 and records[1].total_matches == 0
    assert [m.reason for m in records[1].near_misses] == [
        "the normalized input is not r + gate * y with gate (B, 1, N) or (B, N) and r, y shaped like the sum, "
        "nor r + y of two tensors shaped like the sum, of its dtype"]
    assert not _gated_residual_ops(graph_module)
