"""Linear + tanh GELU fusion: the bias add and GELU go into the GEMM's epilogue (one
``kopt::linear_gelu_tanh``), in both forms the graph holds them (``addmm`` and, after bias
absorption, ``mm + b``); exact GELU and a GEMM output read elsewhere are left alone."""

from __future__ import annotations

import pytest
import torch

import kopt
from kopt.fx.capture import trace_function
from kopt.passes.fuse.linear_gelu import FuseLinearGelu
from kopt.passes.graph.bias_absorption import BiasAbsorption
from kopt.passes.manager import run_passes
from kopt.passes.pipeline import default_pipeline
from tests.conftest import rel_err

FUSED = torch.ops.kopt.linear_gelu_tanh.default


def _feed_forward(x, w1, b1, w2, b2):
    h = torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1), approximate="tanh")
    return torch.nn.functional.linear(h, w2, b2)


def _feed_forward_exact_gelu(x, w1, b1, w2, b2):
    return torch.nn.functional.linear(torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1)), w2, b2)


def _args(dtype=torch.float32):
    g = torch.Generator().manual_seed(7)
    shapes = [(2, 37, 48), (96, 48), (96,), (48, 96), (48,)]  # 74 rows: not a power of two
    return [torch.randn(s, generator=g).to(dtype) for s in shapes]


def _ops(graph_module):
    return [n.target for n in graph_module.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("absorbed_first", [False, True])
def test_both_forms_fuse_and_match_float64(absorbed_first):
    args = _args(torch.bfloat16)
    graph_module = trace_function(_feed_forward, *args)
    passes = [BiasAbsorption(), FuseLinearGelu()] if absorbed_first else [FuseLinearGelu()]
    records = run_passes(graph_module, passes, strict=True)
    assert records[-1].matches == {"linear-gelu-tanh": 1}
    ops = _ops(graph_module)
    assert ops.count(FUSED) == 1 and torch.ops.aten.gelu.default not in ops
    fresh = [torch.randn_like(a) for a in args]  # new values, same shapes
    exact = _feed_forward(*[a.double() for a in fresh])
    got = graph_module(*fresh)
    got = got[0] if isinstance(got, (tuple, list)) else got
    assert rel_err(got, exact) < 1e-2  # bf16-sized; a wrong GELU or a lost bias is far larger
    assert rel_err(got, _feed_forward(*fresh)) < 2e-2  # and as close to eager bf16


def test_the_op_is_the_tanh_gelu_on_every_device_it_runs_on():
    x, w, b = torch.randn(64, 40, dtype=torch.float64), torch.randn(24, 40, dtype=torch.float64), torch.randn(24)
    b = b.double()
    got = torch.ops.kopt.linear_gelu_tanh(x, w.t(), b)
    want = torch.nn.functional.gelu(x @ w.t() + b, approximate="tanh")
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(got, torch.nn.functional.gelu(x @ w.t() + b), rtol=1e-9, atol=1e-9)


def test_exact_gelu_is_left_alone_with_its_reason():
    graph_module = trace_function(_feed_forward_exact_gelu, *_args())
    record = run_passes(graph_module, [FuseLinearGelu()], strict=True)[0]
    assert record.matches == {} and FUSED not in _ops(graph_module)
    assert any("tanh approximation only" in miss for miss in map(str, record.near_misses))


def test_a_gemm_output_read_elsewhere_is_not_fused():
    def reads_twice(x, w1, b1, w2, b2):
        h = torch.nn.functional.linear(x, w1, b1)
        return torch.nn.functional.linear(torch.nn.functional.gelu(h, approximate="tanh"), w2, b2) + h.sum()

    graph_module = trace_function(reads_twice, *_args())
    record = run_passes(graph_module, [FuseLinearGelu()], strict=True)[0]
    assert record.matches == {} and FUSED not in _ops(graph_module)
    assert any("read elsewhere" in miss for miss in map(str, record.near_misses))


def test_fires_once_per_tanh_gelu_on_tiny_ltx_video_and_stays_within_the_contract():
    from tests.conftest import tiny_model_and_inputs

    _, model, inputs = tiny_model_and_inputs("ltx-video", seed=3, dtype=torch.float32)
    assert "fuse-linear-gelu" in [p.name for p in default_pipeline()]
    compiled = kopt.compile(model, passes="auto", lower="eager", verify=True)
    with torch.no_grad():
        got, want = compiled(**inputs)[0], model(**inputs)[0]
    assert rel_err(got, want) < 1e-5  # float32: the epilogue's one rounding is float32's
    record = compiled.kopt_report.pass_records("fuse-linear-gelu")[0]
    # the feed-forward of each block and the caption projection: a linear, then GELU(tanh)
    tanh_gelus = sum(1 for m in model.modules() if getattr(m, "approximate", None) == "tanh")
    assert tanh_gelus >= 2 and record.matches == {"linear-gelu-tanh": tanh_gelus}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_cuda_epilogue_is_the_tanh_gelu_of_the_biased_product():
    """cuBLASLt's GELU-bias epilogue (or ATen's fallback) at an FF shape, against float64."""
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(6930, 2048, device="cuda", generator=g).bfloat16()
    w = (torch.randn(8192, 2048, device="cuda", generator=g) / 45).bfloat16()
    b = torch.randn(8192, device="cuda", generator=g).bfloat16()
    got = torch.ops.kopt.linear_gelu_tanh(x, w.t(), b)
    exact = torch.nn.functional.gelu(x.double() @ w.double().t() + b.double(), approximate="tanh")
    assert rel_err(got, exact) < 1e-2
