"""On a CUDA device: the generated ops run compiled Triton (not the interpreter) and match the
reference computed on the CPU, at the test shapes and at a transformer's width; and under Inductor."""

from __future__ import annotations

import pytest
import torch

from kopt.codegen import compile_region
from kopt.passes.fuse.codegen import CodegenFuse
from kopt.passes.manager import run_passes
from tests.codegen.conftest import only_region, region_inputs
from tests.codegen.test_generated_kernels import CASES, KERNEL_TOL, _randn, layer_norm_modulate, rms_norm
from tests.conftest import rel_err

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _check_on_cuda(fn, inputs, fresh, dtype):
    graph_module, region = only_region(fn, *inputs)
    generated = compile_region(region)
    cpu_inputs = region_inputs(graph_module, region, *fresh)
    got = generated.op(*[t.cuda() for t in cpu_inputs])
    got = (got,) if isinstance(got, torch.Tensor) else got
    for out, want in zip(got, generated.module.reference(*cpu_inputs), strict=True):
        assert out.is_cuda and out.shape == want.shape and out.dtype == want.dtype
        assert rel_err(out.cpu(), want) < KERNEL_TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_cases_on_cuda(case, dtype):
    fn, make = CASES[case]
    _check_on_cuda(fn, make(dtype, 1), make(dtype, 2), dtype)


@pytest.mark.parametrize("fn, n", [(rms_norm, 3072), (layer_norm_modulate, 5000)])
def test_transformer_width_on_cuda(fn, n):
    def make(seed):
        x = _randn((2, 257, n), torch.bfloat16, seed, 2.0)
        if fn is rms_norm:
            return [x, _randn((n,), torch.float32, seed + 1, 0.2, 1)]
        return [x, _randn((2, n), torch.bfloat16, seed + 1, 0.5), _randn((2, n), torch.bfloat16, seed + 2)]

    _check_on_cuda(fn, make(1), make(2), torch.bfloat16)


def test_generated_ops_under_inductor_on_cuda():
    def make(seed):
        return [_randn((2, 33, 96), torch.bfloat16, seed, 2.0), _randn((2, 96), torch.bfloat16, seed + 1, 0.5),
                _randn((2, 96), torch.bfloat16, seed + 2)]

    from kopt.fx.capture import trace_function

    graph_module = trace_function(layer_norm_modulate, *make(1))
    (record,) = run_passes(graph_module, [CodegenFuse()], strict=True)
    assert record.total_matches == 1
    graph_module = graph_module.cuda()
    compiled = torch.compile(lambda x, s, h: graph_module(x * 0.5, s, h) + 1.0, backend="inductor")
    inputs = [t.cuda() for t in make(2)]
    with torch.no_grad():
        got = compiled(*inputs)
    want = layer_norm_modulate(make(2)[0].float() * 0.5, *[t.float() for t in make(2)[1:]]) + 1.0
    assert rel_err(got.float().cpu(), want) < 2e-2
