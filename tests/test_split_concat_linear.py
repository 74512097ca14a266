"""Split a linear over a concatenation (``split-concat-linear``): one GEMM per part, adding into the
last, a tanh-GELU part in its GEMM's epilogue; the concatenation is gone and the result matches a
float64 reference on fresh inputs. Concatenations with no part to move into an epilogue, along another
dimension, or read elsewhere, are left alone with their reason; in ``"auto"`` the pass runs before
sibling-merge, which still merges Q/K/V (FLUX.1's single-stream block); on the three zoo models it
fires on, the output stays as close to float64 as eager's, and FLUX.2's SwiGLU concatenation is left
alone."""

from __future__ import annotations

import pytest
import torch

import kopt
from kopt.fp8.config import Fp8Config, Granularity
from kopt.fx.capture import trace_function
from kopt.passes.graph.concat_split import SplitConcatLinear
from kopt.passes.manager import run_passes
from kopt.passes.pipeline import added_by_name, available_passes, default_pipeline, fp8_pipeline, with_pass
from tests.conftest import rel_err, tiny_model_and_inputs

aten = torch.ops.aten
FUSED = torch.ops.kopt.linear_gelu_tanh.default
F = torch.nn.functional


def _single_block(x, attn, w_mlp, b_mlp, w_out, b_out):
    """FLUX.1's single-stream tail: proj_out(cat([attention, gelu_tanh(proj_mlp(x))]))."""
    mlp = F.gelu(F.linear(x, w_mlp, b_mlp), approximate="tanh")
    return F.linear(torch.cat([attn, mlp], dim=2), w_out, b_out)


def _three_parts_no_bias(a, b, c, w):
    return torch.cat([a, b.sigmoid(), c], dim=-1) @ w.t()


def _three_parts_one_gelu(a, x, w_mlp, b_mlp, c, w):
    return torch.cat([a, F.gelu(F.linear(x, w_mlp, b_mlp), approximate="tanh"), c], dim=-1) @ w.t()


def _args(dtype=torch.float32, seed=7):
    g = torch.Generator().manual_seed(seed)
    shapes = [(2, 37, 48), (2, 37, 24), (96, 48), (96,), (40, 24 + 96), (40,)]  # 74 rows, widths 24 + 96
    return [(torch.randn(s, generator=g) * (0.2 if len(s) == 2 else 1)).to(dtype) for s in shapes]


def _ops(graph_module):
    return [n.target for n in graph_module.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_single_block_tail_splits_with_the_gelu_in_the_epilogue_and_matches_float64(dtype):
    graph_module = trace_function(_single_block, *_args(dtype))
    record = run_passes(graph_module, [SplitConcatLinear()], strict=True)[0]
    assert record.matches == {"split-concat-linear": 1}
    ops = _ops(graph_module)
    assert aten.cat.default not in ops and aten.gelu.default not in ops and ops.count(FUSED) == 1
    assert ops.count(aten.addmm.default) + ops.count(aten.mm.default) == 2  # one GEMM per part
    fresh = _args(dtype, seed=11)  # new values, same shapes
    exact = _single_block(*[a.double() for a in fresh])
    got = graph_module(*fresh)
    got = got[0] if isinstance(got, (tuple, list)) else got
    bound = 1e-6 if dtype is torch.float32 else 1e-2  # a lost part or bias is O(1)
    assert 0 < rel_err(got, exact) < bound
    assert rel_err(_single_block(*fresh), exact) < bound  # eager's own error is of the same size


def test_three_parts_without_bias_one_of_them_a_gelu_split_into_three_gemms():
    g = torch.Generator().manual_seed(3)
    shapes = [(3, 19, 8), (3, 19, 10), (16, 10), (16,), (3, 19, 5), (6, 8 + 16 + 5)]
    args = [torch.randn(s, generator=g) for s in shapes]
    graph_module = trace_function(_three_parts_one_gelu, *args)
    record = run_passes(graph_module, [SplitConcatLinear()], strict=True)[0]
    ops = _ops(graph_module)
    assert record.matches == {"split-concat-linear": 1} and aten.cat.default not in ops and ops.count(FUSED) == 1
    assert ops.count(aten.mm.default) == 1 and ops.count(aten.addmm.default) == 2
    fresh = [torch.randn_like(a) for a in args]
    got = graph_module(*fresh)
    got = got[0] if isinstance(got, (tuple, list)) else got
    assert 0 < rel_err(got, _three_parts_one_gelu(*[a.double() for a in fresh])) < 1e-6


def test_a_concatenation_with_no_part_to_move_into_an_epilogue_is_left_alone():
    """Each part is written and read once either way (a SwiGLU or sigmoid part fuses into the copy):
    splitting would only add GEMMs."""
    g = torch.Generator().manual_seed(3)
    args = [torch.randn(3, 19, k, generator=g) for k in (8, 16, 5)] + [torch.randn(12, 29, generator=g)]
    graph_module = trace_function(_three_parts_no_bias, *args)
    record = run_passes(graph_module, [SplitConcatLinear()], strict=True)[0]
    assert record.matches == {} and aten.cat.default in _ops(graph_module)
    assert any("epilogue" in str(miss) for miss in record.near_misses)


def test_a_concatenation_along_rows_or_read_elsewhere_is_left_alone_with_its_reason():
    def rows(a, b, w):
        return F.linear(torch.cat([a, b], dim=0), w)

    def read_twice(a, b, w):
        joined = torch.cat([a, b], dim=-1)
        return F.linear(joined, w) , joined.sum()

    g = torch.Generator().manual_seed(5)
    along_rows = trace_function(rows, torch.randn(7, 16, generator=g), torch.randn(9, 16, generator=g),
                                torch.randn(8, 16, generator=g))
    record = run_passes(along_rows, [SplitConcatLinear()], strict=True)[0]
    assert record.matches == {} and aten.cat.default in _ops(along_rows)
    assert any("last dimension" in str(miss) for miss in record.near_misses)
    twice = trace_function(read_twice, torch.randn(7, 6, generator=g), torch.randn(7, 10, generator=g),
                           torch.randn(8, 16, generator=g))
    record = run_passes(twice, [SplitConcatLinear()], strict=True)[0]
    assert record.matches == {} and any("read elsewhere" in str(miss) for miss in record.near_misses)


def test_in_auto_it_runs_before_sibling_merge_and_not_in_the_fp8_pipeline():
    auto = tuple(p.name for p in default_pipeline())
    assert available_passes()["split-concat-linear"].runs_before == "sibling-merge"
    assert auto.index("split-concat-linear") == auto.index("sibling-merge") - 1
    assert "split-concat-linear" not in added_by_name()
    with pytest.raises(ValueError, match="already"):
        with_pass(auto, "split-concat-linear")
    fp8 = [p.name for p in fp8_pipeline(Fp8Config(granularity=Granularity.ROW, attention=True))]
    assert "split-concat-linear" not in fp8  # fp8-linear quantizes whole weights, not the split's slices


def test_on_tiny_flux1_every_single_block_splits_and_q_k_v_still_merge():
    _, model, inputs = tiny_model_and_inputs("flux1", seed=2, dtype=torch.float32)
    compiled = kopt.compile(model, passes="auto", lower="eager", verify=True, progress=False)
    with torch.no_grad():
        got, want = compiled(**inputs)[0], model(**inputs)[0]
    assert 0 < rel_err(got, want) < 1e-5  # float32: only the order of the sums changed
    report = compiled.kopt_report
    # each single block's proj_out; the timestep and guidance embeddings' linear over cat([sin, cos])
    # has no GELU part to move into an epilogue
    assert report.matches("split-concat-linear") == len(model.single_transformer_blocks)
    fused = sum(1 for g in compiled._kopt_backend.compiled for n in g.captured.graph_module.graph.nodes
                if n.target is FUSED)
    assert fused == len(model.single_transformer_blocks) + len(model.transformer_blocks) * 2  # + the FFs
    merged = report.pass_records("sibling-merge")[0].matches["merge-siblings"]
    assert merged >= len(model.single_transformer_blocks)  # each single block's Q/K/V (proj_mlp no longer)


def test_a_narrow_concatenation_before_a_wide_linear_is_left_alone():
    """cat([sin, cos]) (256 wide) before a 3072-wide linear: splitting would read back more than it saves."""
    def timestep_embedding(angles, w, b):
        return F.linear(torch.cat([angles.sin(), angles.cos()], dim=-1), w, b)

    g = torch.Generator().manual_seed(1)
    graph_module = trace_function(timestep_embedding, torch.randn(2, 128, generator=g),
                                  torch.randn(3072, 256, generator=g), torch.randn(3072, generator=g))
    record = run_passes(graph_module, [SplitConcatLinear()], strict=True)[0]
    assert record.matches == {} and aten.cat.default in _ops(graph_module)
    assert any("not wider than the partial sums" in str(miss) for miss in record.near_misses)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_at_flux1_widths_the_split_matches_float64():
    """cuBLAS on the weight's column slices (strided views) and on a partial sum as addmm's input,
    the GELU part in cuBLASLt's epilogue: FLUX.1's single-block widths, 1,000 tokens, bf16."""
    g = torch.Generator(device="cuda").manual_seed(9)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).bfloat16()

    args = [randn(1, 1000, 3072), randn(1, 1000, 3072), randn(12288, 3072, scale=0.02), randn(12288, scale=0.1),
            randn(3072, 15360, scale=0.01), randn(3072, scale=0.1)]
    graph_module = trace_function(_single_block, *args)
    assert run_passes(graph_module, [SplitConcatLinear()], strict=True)[0].matches == {"split-concat-linear": 1}
    with torch.no_grad():
        got = graph_module(*args)
    got = got[0] if isinstance(got, (tuple, list)) else got
    exact = _single_block(*[a.double() for a in args])
    assert 0 < rel_err(got, exact) < 1e-2
    assert rel_err(got, exact) < 1.5 * rel_err(_single_block(*args), exact) + 2 ** -8  # as close as eager bf16


def test_a_gelu_part_read_elsewhere_leaves_the_concatenation_alone():
    """The GELU also feeds another op: fusing it into a new GEMM would compute the linear twice, and
    without the epilogue the split saves nothing."""
    def also_read(x, attn, w_mlp, b_mlp, w_out, b_out):
        mlp = F.gelu(F.linear(x, w_mlp, b_mlp), approximate="tanh")
        return F.linear(torch.cat([attn, mlp], dim=2), w_out, b_out), mlp.sum()

    graph_module = trace_function(also_read, *_args())
    record = run_passes(graph_module, [SplitConcatLinear()], strict=True)[0]
    ops = _ops(graph_module)
    assert record.matches == {} and aten.cat.default in ops and FUSED not in ops
    assert any("epilogue" in str(miss) for miss in record.near_misses)


@pytest.mark.parametrize("name", ["flux1", "chroma", "hunyuan-video"])
def test_the_single_stream_blocks_of_three_zoo_models_split_and_stay_as_accurate_as_eager(name):
    """Every zoo model whose blocks read a GELU part through a concatenated linear (regional, tiny,
    fp32): the pass fires in "auto", and the output is as close to a float64 copy as eager's."""
    import copy

    from benchmarks.dit.zoo import BOUND_FACTOR, FLOOR, first_tensor, upcast

    _, model, inputs = tiny_model_and_inputs(name, seed=1, dtype=torch.float32)
    reference_model = copy.deepcopy(model).double()
    with torch.no_grad():
        exact = first_tensor(reference_model(**upcast(inputs)))
        eager = first_tensor(model(**inputs))
        compiled = kopt.compile(model, passes="auto", lower="eager", regional=True, progress=False)
        got = first_tensor(compiled(**inputs))
    assert compiled.kopt_report.matches("split-concat-linear") >= 1
    assert rel_err(got, exact) <= BOUND_FACTOR * rel_err(eager, exact) + FLOOR["fp32"]


def test_flux2s_swiglu_concatenation_is_left_alone_with_its_reason():
    """FLUX.2's single-stream blocks concatenate attention with silu(gate) * up: no epilogue to gain."""
    _, model, inputs = tiny_model_and_inputs("flux2", seed=1, dtype=torch.float32)
    with torch.no_grad():
        compiled = kopt.compile(model, passes="auto", lower="eager", regional=True, progress=False)
        compiled(**inputs)
    report = compiled.kopt_report
    assert report.matches("split-concat-linear") == 0
    misses = [str(m) for r in report.pass_records("split-concat-linear") for m in r.near_misses]
    assert any("epilogue" in m for m in misses), misses

