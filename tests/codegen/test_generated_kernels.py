"""Generated kernels: readable valid source, and the Triton kernel (interpreted on the CPU) against
the generated reference and against the model's own unfused arithmetic, on awkward sizes."""

from __future__ import annotations

import ast
import zlib

import pytest
import torch

from kopt.codegen import compile_region
from tests.codegen.conftest import only_region, region_inputs, region_outputs
from tests.conftest import rel_err

# kernel vs generated reference (same float32 arithmetic; outputs differ by at most one rounding)
KERNEL_TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
# fused (float32, one rounding) vs the unfused graph (rounds after every op in bf16)
GRAPH_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _randn(shape, dtype, seed, scale=1.0, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale + offset).to(dtype)


def elementwise_two_outputs(x, y):
    a = x * y + 1.5
    return a, torch.sigmoid(a) * x - y.abs().sqrt()


def rms_norm(x, weight):
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + 1e-6) * weight).to(x.dtype)


def layer_norm_var_mean(x, weight, bias):
    var, mean = torch.var_mean(x.float(), -1, keepdim=True, correction=0)
    return ((x.float() - mean) * torch.rsqrt(var + 1e-5) * weight + bias).to(x.dtype), mean


def layer_norm_modulate(x, scale, shift):
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-6)
    return y * (1 + scale[:, None]) + shift[:, None]


def modulation(x, scale, shift, gate):
    return (1 + scale) * x + shift, x * gate  # scale/shift (B, 1, N); gate (B, S, 1): one value per row


def gelu_tanh_chain(x, bias, y):
    return torch.nn.functional.gelu(x + bias, approximate="tanh") * y


def softmax_stats(x):
    return torch.exp(x - x.amax(-1, keepdim=True)), x.amax(-1)


CASES = {
    "elementwise-2-outputs": (elementwise_two_outputs, lambda d, s: [_randn((5, 37), d, s), _randn((5, 37), d, s + 1)]),
    "rms-norm": (rms_norm, lambda d, s: [_randn((5, 37), d, s, 2.0, 0.3), _randn((37,), torch.float32, s + 1, 0.2, 1)]),
    "layer-norm-var-mean": (layer_norm_var_mean, lambda d, s: [
        _randn((2, 3, 37), d, s, 3.0, 0.5), _randn((37,), d, s + 1, 0.2, 1.0), _randn((37,), d, s + 2)]),
    "layer-norm-modulate": (layer_norm_modulate, lambda d, s: [
        _randn((2, 3, 37), d, s, 2.0), _randn((2, 37), d, s + 1, 0.5), _randn((2, 37), d, s + 2)]),
    "modulation-broadcast": (modulation, lambda d, s: [
        _randn((2, 3, 37), d, s), _randn((2, 1, 37), d, s + 1, 0.5), _randn((2, 1, 37), d, s + 2),
        _randn((2, 3, 1), d, s + 3)]),
    "gelu-tanh-chain": (gelu_tanh_chain, lambda d, s: [
        _randn((5, 37), d, s, 2.0), _randn((37,), d, s + 1), _randn((5, 37), d, s + 2)]),
    "rank-4-broadcast": (modulation, lambda d, s: [
        _randn((2, 2, 3, 37), d, s), _randn((2, 1, 1, 37), d, s + 1, 0.5), _randn((1, 2, 1, 37), d, s + 2),
        _randn((2, 1, 3, 1), d, s + 3)]),
    "softmax-stats": (softmax_stats, lambda d, s: [_randn((5, 37), d, s, 3.0)]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_matches_reference_and_graph(case, dtype):
    fn, make = CASES[case]
    seed = zlib.crc32(f"{case}-{dtype}".encode())
    graph_module, region = only_region(fn, *make(dtype, seed))
    generated = compile_region(region)
    fresh = make(dtype, seed + 100)  # not the tracing inputs
    inputs = region_inputs(graph_module, region, *fresh)
    kernel = generated.module.launch(*inputs)
    reference = generated.module.reference(*inputs)
    unfused = region_outputs(graph_module, region, *fresh)
    assert len(kernel) == len(reference) == len(unfused) == len(region.outputs) >= 1
    for got, spec, model in zip(kernel, reference, unfused, strict=True):
        assert got.shape == spec.shape == model.shape and got.dtype == spec.dtype == model.dtype
        assert got.is_contiguous()
        assert rel_err(got, spec) < KERNEL_TOL[dtype]
        assert rel_err(spec, model) < GRAPH_TOL[dtype]
    op_outputs = generated.op(*inputs)  # CPU: the op runs the reference
    op_outputs = (op_outputs,) if isinstance(op_outputs, torch.Tensor) else op_outputs
    for got, spec in zip(op_outputs, reference, strict=True):
        assert torch.equal(got, spec)


def test_source_is_valid_readable_python():
    _graph_module, region = only_region(rms_norm, _randn((5, 37), torch.bfloat16, 1), _randn((37,), torch.float32, 2))
    source = compile_region(region).source
    tree = ast.parse(source)
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert {"reference", "region_kernel", "launch", "empty_outputs"} <= functions
    for node in region.members:  # every computing line names the FX node it came from
        assert f"# {node.name} = " in source
    assert "@triton.jit" in source and "tl.sum(" in source and "mask=" in source
    assert "# in0  <- x_1 (5, 37) bfloat16" in source
    assert all(len(line) < 200 for line in source.splitlines())


def test_row_count_not_a_multiple_of_the_block():
    """7 rows of N=3 (block of 4 columns, several rows per program): the last program is half empty."""
    x, y = _randn((7, 3), torch.float32, 5), _randn((7, 3), torch.float32, 6)
    graph_module, region = only_region(elementwise_two_outputs, x, y)
    generated = compile_region(region)
    inputs = region_inputs(graph_module, region, x, y)
    for got, spec in zip(generated.module.launch(*inputs), generated.module.reference(*inputs), strict=True):
        assert rel_err(got, spec) < 1e-6


def test_non_contiguous_input_read_through_its_strides():
    x = _randn((37, 5), torch.float32, 7).t()  # (5, 37) with strides (1, 5)
    weight = _randn((37,), torch.float32, 8, 0.2, 1)
    # traced on a contiguous input (a region whose output eager lays out non-contiguously is refused:
    # the generated op writes contiguous outputs), launched on the transposed one
    _graph_module, region = only_region(rms_norm, x.contiguous(), weight)
    generated = compile_region(region)
    (got,) = generated.module.launch(x, weight)
    assert rel_err(got, rms_norm(x, weight)) < 1e-5



def row_quantize(x):
    """FP8 row quantization as the graph spells it: torch's amax and clamp keep a NaN."""
    scale = x.float().abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448.0
    return scale, (x.float() / scale).clamp(-448.0, 448.0)


def relu_of_max(x, y):
    return torch.relu(torch.minimum(torch.maximum(x, y * 0.5), x + 1.0))


@pytest.mark.parametrize("fn", [row_quantize, relu_of_max])
def test_nan_reaches_the_outputs_where_torch_puts_it(fn):
    """A NaN in a row makes its amax NaN, and max/min/clamp/relu pass a NaN on: the generated kernel
    must agree with eager on which outputs are NaN (a kernel that drops them would mask a bad input)."""
    x, y = _randn((7, 37), torch.float32, 11), _randn((7, 37), torch.float32, 12)
    x[2, 5] = y[3, 1] = float("nan")
    x[4, 0] = float("inf")
    inputs = (x,) if fn is row_quantize else (x, y)
    graph_module, region = only_region(fn, *inputs)
    got = compile_region(region).module.launch(*region_inputs(graph_module, region, *inputs))
    wanted = fn(*inputs)
    wanted = wanted if isinstance(wanted, tuple) else (wanted,)
    for g, want in zip(got, wanted, strict=True):
        assert torch.isnan(want).any()
        assert torch.equal(torch.isnan(g), torch.isnan(want)), (torch.isnan(g).sum(), torch.isnan(want).sum())
        finite = torch.isfinite(want)
        assert rel_err(g[finite], want[finite]) < 1e-5


def capped_scores(scores, mask):
    return (mask + torch.tanh(scores * 0.0625 / 50.0) * 50.0).float()


@pytest.mark.parametrize("scale", [1e-6, 1e-3, 1.0, 300.0])
def test_tanh_keeps_its_relative_accuracy_at_every_magnitude(scale):
    """Gemma 2's logit cap, ``mask + 50 tanh(s / 50)``, on scores of every magnitude: tanh spelled as
    ``2 sigmoid(2x) - 1`` loses all relative accuracy near 0 (the 1 cancels: rel 0.06 on scores of
    1e-6), so small arguments take the odd series instead."""
    scores = _randn((4, 2, 37), torch.float32, 11, scale)
    mask = _randn((1, 2, 37), torch.float32, 12, scale)
    graph_module, region = only_region(capped_scores, scores, mask)
    generated = compile_region(region)
    inputs = region_inputs(graph_module, region, scores, mask)
    (got,) = generated.module.launch(*inputs)
    exact = (mask.double() + torch.tanh(scores.double() * 0.0625 / 50.0) * 50.0)
    assert rel_err(got, exact) < 1e-6
