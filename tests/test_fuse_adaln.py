"""adaLN fusion: both models' norm + modulation regions become one kopt op; numbers match."""

from __future__ import annotations

import torch

import kopt
from kopt.fx.capture import trace_function
from kopt.passes.fuse.adaln import FuseAdaLN
from kopt.passes.manager import run_passes
from tests.conftest import rel_err

# Qwen-Image: img/txt norm1 and norm2 of 2 blocks, less the last block's text norm2 (its output is
# dead code), plus norm_out; FLUX.2: norm1/norm2 and their context twins in the double block, the
# single block's norm, and norm_out. Every layer norm of both models.
EXPECTED = {"qwen-image": 8, "flux2": 6}
PIPELINE = ["redundancy", "sibling-merge", "bias-absorption", "fuse-adaln", "staging"]


def test_fires_on_tiny_dits_and_matches_eager(tiny_dit):
    workload, model, inputs = tiny_dit
    compiled = kopt.compile(model, passes=PIPELINE, lower="eager", verify=True)
    with torch.no_grad():
        assert rel_err(compiled(**inputs)[0], model(**inputs)[0]) < 1e-5
        fresh = workload.inputs("tiny", seed=31)
        assert rel_err(compiled(**fresh)[0], model(**fresh)[0]) < 1e-5
    record = compiled.kopt_report.pass_records("fuse-adaln")[0]
    assert record.matches == {"adaln-modulation": EXPECTED[workload.name]}
    assert compiled.kopt_report.graphs[0].fallback is None
    assert compiled.kopt_report.graphs[0].memo is not None  # staging still splits after the fusion


def _adaln(x, scale, shift):
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-6)
    return (1 + scale[:, None]) * y + shift[:, None]


def test_golden_graph_is_one_op():
    x, scale, shift = torch.randn(2, 5, 24), torch.randn(2, 24), torch.randn(2, 24)
    graph_module = trace_function(_adaln, x, scale, shift)
    (record,) = run_passes(graph_module, [FuseAdaLN()], strict=True)
    assert record.matches == {"adaln-modulation": 1}
    ops = [n.target for n in graph_module.graph.nodes if n.op == "call_function"]
    assert torch.ops.kopt.adaln_modulation.default in ops
    assert torch.ops.aten.native_layer_norm.default not in ops and torch.ops.aten.mul.Tensor not in ops
    x, scale, shift = torch.randn(2, 5, 24), torch.randn(2, 24), torch.randn(2, 24)
    assert rel_err(graph_module(x, scale, shift), _adaln(x, scale, shift)) < 1e-6


def test_declines_affine_norms_and_per_token_modulation():
    ln = torch.nn.LayerNorm(24)

    def affine(x, scale, shift):
        return ln(x) * (1 + scale[:, None]) + shift[:, None]

    def per_token(x, scale, shift):
        y = torch.nn.functional.layer_norm(x, (24,))
        return y * (1 + scale) + shift

    for fn, args, reason in ((affine, (torch.randn(2, 5, 24), torch.randn(2, 24), torch.randn(2, 24)), "affine"),
                             (per_token, (torch.randn(2, 5, 24),) * 3, "per-sample")):
        graph_module = trace_function(fn, *args)
        (record,) = run_passes(graph_module, [FuseAdaLN()], strict=True)
        assert record.total_matches == 0
        assert any(reason in m.reason for m in record.near_misses), record.near_misses


def test_fused_op_survives_inductor():
    """Inductor lowers the graph around kopt::adaln_modulation (a custom op with a fake) correctly."""
    from kopt.workloads import get_workload

    workload = get_workload("flux2")
    torch.manual_seed(4)
    model = workload.model("tiny")
    compiled = kopt.compile(model, passes=PIPELINE)
    inputs = workload.inputs("tiny", seed=12)
    with torch.no_grad():
        assert rel_err(compiled(**inputs)[0], model(**inputs)[0]) < 1e-5
    assert compiled.kopt_report.matches("fuse-adaln") == 6
    assert compiled.kopt_report.graphs[0].lowering == "inductor"


def _rms_adaln(norm):
    def fn(x, scale, shift):
        return norm(x) * (1 + scale[:, None]) + shift[:, None]
    return fn


def _float64_rms_adaln(x, scale, shift, eps=1e-6):
    x64 = x.double()
    normed = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    return normed * (1 + scale.double()[:, None]) + shift.double()[:, None]


def test_the_rmsnorm_form_is_one_op_in_each_spelling_and_keeps_the_contract():
    """LTX-Video's blocks modulate an RMSNorm without weight: diffusers' spelling (float32 statistics,
    a cast back) and ``torch.nn.RMSNorm``'s both become ``adaln_modulation(..., rms=True)``, in
    float32 and bfloat16, within a bfloat16 ulp of a float64 reference."""
    from diffusers.models.normalization import RMSNorm

    spellings = {"diffusers": RMSNorm(64, eps=1e-6, elementwise_affine=False),
                 "torch": torch.nn.RMSNorm(64, eps=1e-6, elementwise_affine=False)}
    for name, norm in spellings.items():
        for dtype, bound in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
            x, scale, shift = (torch.randn(2, 7, 64, dtype=dtype) * 3, torch.randn(2, 64, dtype=dtype),
                               torch.randn(2, 64, dtype=dtype))
            graph_module = trace_function(_rms_adaln(norm), x, scale, shift)
            (record,) = run_passes(graph_module, [FuseAdaLN()], strict=True)
            assert record.matches == {"adaln-modulation-rms": 1}, (name, dtype, record.near_misses)
            ops = [n.target for n in graph_module.graph.nodes if n.op == "call_function"]
            assert torch.ops.aten.rsqrt.default not in ops, name
            fresh = torch.randn(2, 7, 64, dtype=dtype), torch.randn(2, 64, dtype=dtype), torch.randn(2, 64, dtype=dtype)
            got = graph_module(*fresh)
            assert got.dtype == dtype
            assert rel_err(got, _float64_rms_adaln(*fresh)) < bound, (name, dtype)


def test_the_rmsnorm_form_declines_a_weight_and_a_normalized_value_read_twice():
    from diffusers.models.normalization import RMSNorm

    weighted = RMSNorm(64, eps=1e-6, elementwise_affine=True)
    with torch.no_grad():
        weighted.weight.normal_()
    plain = RMSNorm(64, eps=1e-6, elementwise_affine=False)

    def read_twice(x, scale, shift):
        y = plain(x)
        return y * (1 + scale[:, None]) + shift[:, None], y.sum()

    args = torch.randn(2, 7, 64), torch.randn(2, 64), torch.randn(2, 64)
    for fn, reason in ((_rms_adaln(weighted), "has a weight"), (read_twice, "read elsewhere")):
        graph_module = trace_function(fn, *args)
        (record,) = run_passes(graph_module, [FuseAdaLN()], strict=True)
        assert record.total_matches == 0
        assert any(reason in m.reason for m in record.near_misses), record.near_misses
