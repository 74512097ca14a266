"""residual-fp32: a chain of gated residual adds computes in float32; the output moves toward float64."""

from __future__ import annotations

import pytest
import torch

import kopt
from kopt.fp8.config import Fp8Config
from kopt.fx.capture import trace_function
from kopt.passes.fuse.adaln import FuseAdaLN
from kopt.passes.fuse.gated_residual import FuseGatedResidual
from kopt.passes.graph.residual_fp32 import ResidualStreamFp32
from kopt.passes.manager import run_passes
from kopt.passes.pipeline import default_pipeline, fp8_pipeline
from kopt.reference import reference_forward
from tests.conftest import rel_err

WIDTH = 48


class GatedStack(torch.nn.Module):
    """Blocks of ``r = r + gate * mlp(modulated norm(r))`` on two streams joined by a ``cat`` halfway
    (FLUX's double then single blocks), a final norm on a slice: the shapes of a DiT, not its names."""

    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        self.mlps = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.GELU(),
                                                            torch.nn.Linear(2 * WIDTH, WIDTH)) for _ in range(blocks))
        self.mod = torch.nn.Linear(WIDTH, 3 * WIDTH * blocks)

    def forward(self, image: torch.Tensor, text: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        mods = self.mod(emb).chunk(3 * len(self.mlps), dim=-1)
        half = len(self.mlps) // 2
        for i, mlp in enumerate(self.mlps):
            shift, scale, gate = mods[3 * i:3 * i + 3]
            if i == half:
                image = torch.cat([text, image], dim=1)
            streams = [image] if i >= half else [image, text]
            out = []
            for r in streams:
                m = torch.nn.functional.layer_norm(r, (WIDTH,), eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
                out.append(r + gate[:, None] * mlp(m))
            image, text = (out[0], out[1]) if len(out) == 2 else (out[0], text)
        return torch.nn.functional.layer_norm(image[:, text.shape[1]:], (WIDTH,), eps=1e-6)


def _inputs(seed: int, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g).to(dtype) for shape in ((2, 40, WIDTH), (2, 12, WIDTH), (2, WIDTH)))


def test_a_chain_across_a_cat_and_a_slice_is_widened_and_closer_to_float64():
    torch.manual_seed(0)
    model = GatedStack(blocks=6).to(torch.bfloat16).eval()
    inputs = _inputs(int(torch.randint(1 << 30, ())))
    with_pass = kopt.compile(model, lower="eager", verify=True, progress=False)
    without = kopt.compile(model, passes=[p for p in default_pipeline() if p.name != "residual-fp32"],
                           lower="eager", progress=False)
    reference = reference_forward(model, *inputs)
    with torch.no_grad():
        widened, narrow = with_pass(*inputs), without(*inputs)
    report = with_pass.kopt_report
    # 3 double-stream blocks x 2 streams + 3 joint blocks, one chain each for image (through the cat) and text
    assert report.matches("residual-fp32") == 9 and report.graphs[0].fallback is None
    assert widened.dtype == torch.bfloat16 and widened.shape == narrow.shape
    assert rel_err(widened, reference) < 0.8 * rel_err(narrow, reference)
    assert all(check["ok"] for check in report.graphs[0].verification)


def test_the_stream_is_float32_between_steps_and_the_fused_op_reads_it():
    args = [torch.randn(2, 5, 24, dtype=torch.bfloat16) for _ in range(2)] + \
           [torch.randn(2, 24, dtype=torch.bfloat16) for _ in range(3)]

    def two_boundaries(r, y, gate, scale, shift):
        for _ in range(2):
            r = r + gate[:, None] * y
            y = torch.nn.functional.layer_norm(r, (24,), eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
        return r, y

    graph_module = trace_function(two_boundaries, *args)
    records = run_passes(graph_module, [FuseAdaLN(), FuseGatedResidual(), ResidualStreamFp32()], strict=True)
    assert records[2].matches == {"residual-stream": 2}
    fused = [n for n in graph_module.graph.nodes if n.target is torch.ops.kopt.gated_residual.default]
    assert fused and all(n.args[0].meta["val"].dtype == torch.float32 for n in fused)
    r, m = graph_module(*args)
    assert r.dtype == m.dtype == torch.bfloat16  # the graph's outputs keep their dtypes
    want_r, want_m = two_boundaries(*[a.double() for a in args])
    assert rel_err(r, want_r) < 1e-2 and rel_err(m, want_m) < 1e-2


def test_a_single_step_or_an_ungated_add_is_left_alone():
    def one_step(r, y, gate):
        return (r + gate[:, None] * y) + r  # the outer add has no gate: not a step

    args = [torch.randn(2, 5, 24, dtype=torch.bfloat16), torch.randn(2, 5, 24, dtype=torch.bfloat16),
            torch.randn(2, 24, dtype=torch.bfloat16)]
    graph_module = trace_function(one_step, *args)
    records = run_passes(graph_module, [ResidualStreamFp32()], strict=True)
    assert records[0].total_matches == 0


def _ltx_like_blocks(r, y, gate, scale, shift):
    """LTX-Video's stream: a gated self-attention step, an ungated cross-attention add read by norm2 (fused
    by fuse-gated-residual without a gate) and a gated feed-forward step, twice."""
    for _ in range(2):
        r = r + gate[:, None] * y
        r = r + torch.tanh(r)
        m = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + scale[:, None]) + shift[:, None]
        r = r + gate[:, None] * m
    return r


def test_an_ungated_fused_op_is_not_a_step():
    """The ungated kopt::gated_residual reads a bf16 copy and ends a chain, as the plain add it replaces
    did: the same steps are widened with and without fuse-gated-residual, and the output stays close
    to float64."""
    args = [torch.randn(2, 5, 24, dtype=torch.bfloat16) for _ in range(2)] + \
           [torch.randn(2, 24, dtype=torch.bfloat16) * 0.5 for _ in range(3)]
    fused_graph, plain_graph = (trace_function(_ltx_like_blocks, *args) for _ in range(2))
    fused = run_passes(fused_graph, [FuseAdaLN(), FuseGatedResidual(), ResidualStreamFp32()], strict=True)
    plain = run_passes(plain_graph, [FuseAdaLN(), ResidualStreamFp32()], strict=True)
    assert fused[1].matches == {"plain-residual": 2}
    assert fused[2].matches == plain[1].matches == {"residual-stream": 2}  # the feed-forward step + the next block's
    ungated = [n for n in fused_graph.graph.nodes if n.target is torch.ops.kopt.gated_residual.default]
    assert len(ungated) == 2 and all(n.args[2] is None for n in ungated)
    assert all(n.args[0].meta["val"].dtype == torch.bfloat16 for n in ungated)
    fresh = [torch.randn_like(a) for a in args]
    want = _ltx_like_blocks(*(a.double() for a in fresh))
    assert rel_err(fused_graph(*fresh), want) < 1e-2


def test_float32_models_are_left_alone():
    graph_module = trace_function(GatedStack(blocks=4), *_inputs(3, torch.float32))
    assert run_passes(graph_module, [ResidualStreamFp32()], strict=True)[0].total_matches == 0


@pytest.mark.parametrize("granularity", ["row", "tensor"])
def test_the_fp8_pipeline_leaves_it_out(granularity):
    """The FP8 fusions replace the bf16 gated-residual ops this pass widens (kopt/passes/pipeline.py)."""
    names = [p.name for p in fp8_pipeline(Fp8Config(granularity=granularity))]
    assert "residual-fp32" not in names and "residual-fp32" in [p.name for p in default_pipeline()]
