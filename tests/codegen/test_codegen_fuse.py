"""The codegen-fuse pass: it fires, its graph matches the unfused one, it says why it stopped, and
its ops run under kopt.compile and survive Inductor."""

from __future__ import annotations

import pytest
import torch

import kopt
from kopt.fx.capture import trace_function
from kopt.passes.fuse.codegen import RULE, CodegenFuse
from kopt.passes.manager import run_passes
from kopt.passes.pipeline import available_passes, default_pipeline
from tests.conftest import rel_err


def _block(x, scale, shift, weight):
    """RMSNorm → modulate → gelu, then a softmax over rows: three reductions, so three regions."""
    h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * weight
    h = torch.nn.functional.gelu(h * (1 + scale[:, None]) + shift[:, None], approximate="tanh")
    e = torch.exp(h - h.amax(-1, keepdim=True))
    return (e / e.sum(-1, keepdim=True)).to(x.dtype), h.to(x.dtype)


def _inputs(seed: int, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 3, 37, generator=g).to(dtype), (torch.randn(2, 37, generator=g) * 0.5).to(dtype),
            torch.randn(2, 37, generator=g).to(dtype), torch.randn(37, generator=g) * 0.2 + 1)


def test_pass_is_opt_in():
    assert "codegen-fuse" in available_passes()
    assert "codegen-fuse" not in [p.name for p in default_pipeline()]


def test_fires_and_matches_the_unfused_graph(tmp_path):
    graph_module = trace_function(_block, *_inputs(0))
    (record,) = run_passes(graph_module, [CodegenFuse()], strict=True, trace_dir=tmp_path)
    assert record.matches == {RULE: 3}, record.near_misses
    generated = [n for n in graph_module.graph.nodes if n.op == "call_function"
                 and str(n.target).startswith("kopt.gen_")]
    assert len(generated) == 3
    assert not any(n.target in (torch.ops.aten.rsqrt.default, torch.ops.aten.exp.default)
                   for n in graph_module.graph.nodes)
    assert any(m.reason.startswith("two reductions") for m in record.near_misses), record.near_misses
    assert len(list((tmp_path / "codegen").glob("gen_*.py"))) == 3  # trace_dir: the sources are kept
    fresh = _inputs(7)
    for got, want in zip(graph_module(*fresh), _block(*fresh), strict=True):
        assert got.dtype == want.dtype and rel_err(got, want) < 2e-2


def _rotate_then_merge_heads(q, cos):
    """Elementwise work on a transposed view keeps eager's layout (heads inner), so merging the heads
    back is a plain view: what transformers' attention does with RoPE'd queries."""
    heads = q.transpose(1, 2)
    rotated = heads * cos + heads * 0.5
    return rotated.transpose(1, 2).view(q.shape[0], q.shape[1], -1)


def test_a_region_whose_output_eager_lays_out_non_contiguously_is_left_alone(tmp_path):
    """The generated op writes contiguous outputs; fusing here would break the view that follows
    (or hand later ops other strides), so the region is a near miss that says why."""
    g = torch.Generator().manual_seed(3)
    q, cos = torch.randn(2, 7, 3, 16, generator=g), torch.randn(7, 16, generator=g)
    graph_module = trace_function(_rotate_then_merge_heads, q, cos)
    (record,) = run_passes(graph_module, [CodegenFuse()], strict=True, trace_dir=tmp_path)
    assert record.matches.get(RULE, 0) == 0
    assert any("non-contiguously" in m.reason for m in record.near_misses), record.near_misses
    q, cos = torch.randn(2, 7, 3, 16, generator=g), torch.randn(7, 16, generator=g)
    assert rel_err(graph_module(q, cos), _rotate_then_merge_heads(q.double(), cos.double())) < 1e-6


class TinyMLPBlock(torch.nn.Module):
    def __init__(self, width: int = 24) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.silu(self.up(self.norm(x))) * 1.5
        return x + gate * torch.tanh(self.down(h))


def test_kopt_compile_with_codegen_fuse_matches_eager():
    torch.manual_seed(0)
    model = TinyMLPBlock().eval()
    compiled = kopt.compile(model, passes=["codegen-fuse"], lower="eager", strict=True)
    with torch.no_grad():
        for seed in (1, 2):
            g = torch.Generator().manual_seed(seed)
            x, gate = torch.randn(2, 5, 24, generator=g), torch.randn(2, 1, 24, generator=g)
            assert rel_err(compiled(x, gate), model(x, gate)) < 1e-5
    assert compiled.kopt_report.matches("codegen-fuse") >= 2  # silu·1.5 and the gated residual


@pytest.mark.slow
def test_generated_op_survives_inductor():
    """Inductor keeps the op as a call (its fake gives the shapes) and compiles the code around it."""
    from torch._inductor.utils import run_and_get_code

    graph_module = trace_function(_block, *_inputs(0, torch.float32))
    run_passes(graph_module, [CodegenFuse()], strict=True)
    ops = [n.target for n in graph_module.graph.nodes if str(n.target).startswith("kopt.gen_")]

    assert len(ops) == 3

    def around(x, scale, shift, weight):
        y = graph_module(x * 2.0 - 1.0, scale, shift, weight)  # Inductor fuses x * 2 - 1 itself
        return y[0] + 1.0, y[1].sum(-1)

    compiled = torch.compile(around, backend="inductor", fullgraph=True)
    inputs = _inputs(3, torch.float32)
    with torch.no_grad():
        result, (code, *_) = run_and_get_code(compiled, *inputs)
        expected = around(*inputs)
    for got, want in zip(result, expected, strict=True):
        assert rel_err(got, want) < 1e-5
    assert all(str(op).split(".")[1] in code for op in ops)  # each generated op is called, not decomposed
