"""FP8 path: config, the one quantization definition, the fp8-linear pass (its math equals the
fake-quantized model, weights quantized at compile time, selection by path), the quality gate and
the layer-sensitivity scan. Fresh random inputs; errors relative, in float64."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import kopt
from kopt.fp8 import (
    Fp8Config,
    Granularity,
    QualityGate,
    fake_quantize,
    keep_in_bf16,
    measure,
    quantize,
    scan_sensitivity,
)
from kopt.fp8.quantize import Operand
from kopt.passes.fp8.linear import Fp8Linear
from kopt.workloads import get_workload
from tests.conftest import rel_err

aten = torch.ops.aten
TINY_GATE = QualityGate(min_cosine=0.99, min_sqnr_db=18.0)  # tiny random models: 64-wide layers, all quantized


class Mlp(torch.nn.Module):
    def __init__(self, dtype: torch.dtype = torch.float32, width: int = 64) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width // 2, bias=False)
        self.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


def simulated(mlp: Mlp, x: torch.Tensor, granularity: Granularity) -> torch.Tensor:
    """The FP8 model by hand: fake-quantized inputs and weights, float32 accumulation."""
    def linear(layer, inputs):
        weight = fake_quantize(layer.weight, granularity, Operand.WEIGHT)
        out = fake_quantize(inputs, granularity).float() @ weight.float().T
        return (out + layer.bias.float() if layer.bias is not None else out).to(inputs.dtype)
    flat = x.reshape(-1, x.shape[-1])
    return linear(mlp.down, torch.nn.functional.gelu(linear(mlp.up, flat))).reshape(*x.shape[:-1], -1)


def test_invalid_configs_are_refused_clearly():
    with pytest.raises(ValueError):
        Fp8Config(granularity="per-something")
    with pytest.raises(ValueError, match="min_features"):
        Fp8Config(min_features=-1)


def test_selection_by_weight_path():
    config = Fp8Config(include=("blocks.*",), skip=("*.proj_out.weight",))
    assert config.selects("blocks.0.attn.to_q.weight") is None
    assert "skipped by" in config.selects("blocks.3.proj_out.weight")
    assert "include" in config.selects("embed.weight")
    assert "not a parameter" in config.selects(None)


@pytest.mark.parametrize("granularity", list(Granularity)[:2])
def test_quantization_error_is_bounded_and_scales_have_the_granularity_shape(granularity):
    x = torch.randn(33, 80) * torch.logspace(-2, 2, 33)[:, None]  # rows of very different magnitude
    q, scale = quantize(x, granularity)
    assert q.dtype == torch.float8_e4m3fn
    assert scale.shape == ((33, 1) if granularity is Granularity.ROW else ())
    bound = 0.07 if granularity is Granularity.ROW else 1.0  # per-tensor loses the small rows
    assert rel_err(fake_quantize(x, granularity), x) < bound
    assert rel_err(fake_quantize(x[:1], granularity), x[:1]) < 0.07


@pytest.mark.parametrize("granularity", ["block-1x128", "block-128x128"])
def test_block_scales_follow_the_magnitude_along_both_dims(granularity):
    """Rows and 128-wide column slices of very different magnitude: one scale per block keeps every
    block accurate, where one scale per row loses the small slices of each row."""
    granularity = Granularity(granularity)
    x = torch.randn(130, 384) * torch.logspace(-2, 2, 130)[:, None]
    x[:, 128:256] *= 1e-5  # below e4m3's normal range when sharing a scale with the rest of the row
    q, scale = quantize(x, granularity)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (130, 3)
    _, weight_scale = quantize(x, granularity, Operand.WEIGHT)
    assert weight_scale.shape == ((130, 3) if granularity is Granularity.BLOCK_1X128 else (2, 3))
    for candidate in (fake_quantize(x, granularity), fake_quantize(x, granularity, Operand.WEIGHT)):
        assert candidate.shape == x.shape
    small = fake_quantize(x, granularity)[:, 128:256]
    assert rel_err(small, x[:, 128:256]) < 0.07
    assert rel_err(fake_quantize(x, Granularity.ROW)[:, 128:256], x[:, 128:256]) > 0.2
    with pytest.raises(ValueError, match="divide by 128"):
        quantize(torch.randn(4, 100), granularity)


def test_large_tensors_are_quantized_in_row_slices_with_the_same_result(monkeypatch):
    """130 rows (not a multiple of 128) in slices of 128: every block lies in one slice."""
    import importlib

    quantize_module = importlib.import_module("kopt.fp8.quantize")
    x = torch.randn(130, 384) * torch.logspace(-1, 1, 130)[:, None]
    whole = {(g, o): quantize(x, g, o) for g in Granularity for o in Operand}
    monkeypatch.setattr(quantize_module, "CHUNK_ELEMENTS", 384 * 40)
    for (granularity, operand), (q, scale) in whole.items():
        q_sliced, scale_sliced = quantize(x, granularity, operand)
        assert torch.equal(q_sliced.float(), q.float()) and torch.equal(scale_sliced, scale), (granularity, operand)
        bound = 1.0 if granularity is Granularity.TENSOR else 0.07  # one scale loses the small rows
        assert rel_err(quantize_module.dequantize(q_sliced, scale_sliced), x) < bound


def test_an_all_zero_row_quantizes_without_nan():
    x = torch.randn(4, 32)
    x[2] = 0
    assert torch.isfinite(fake_quantize(x, Granularity.ROW)).all() and fake_quantize(x, Granularity.ROW)[2].eq(0).all()


@pytest.mark.parametrize("granularity", ["row", "tensor", "block-1x128", "block-128x128"])
def test_pass_computes_the_fake_quantized_model_with_weights_quantized_at_compile_time(granularity):
    torch.manual_seed(0)
    width = 256 if granularity.startswith("block") else 64  # blocks need 128-divisible features
    mlp = Mlp(width=width)
    config = Fp8Config(granularity=granularity, min_features=16)
    compiled = kopt.compile(mlp, passes=[], fp8=config, lower="eager")
    x = torch.randn(3, 5, width) * 2 + 0.5
    with torch.no_grad():
        out = compiled(x)
        assert rel_err(out, simulated(mlp, x, Granularity(granularity))) < 1e-5
        assert rel_err(out, mlp(x)) < 0.1
    (record,) = compiled.kopt_report.pass_records("fp8-linear")
    assert record.matches == {"fp8-linear": 2}
    assert "quantized at compile time" in record.notes[0]


def _same_output_within_the_gate(fused, plain, model, inputs) -> None:
    """A producer fusion changes nothing (equal outputs), and both are a working FP8 model."""
    with torch.no_grad():
        out = fused(**inputs)[0]
        assert torch.equal(out, plain(**inputs)[0])
        assert measure(out, model(**inputs)[0], TINY_GATE).passed


def test_graph_has_fp8_gemms_and_no_per_call_weight_quantization():
    """Exactly one amax per linear (its activation): the weights arrive already quantized."""
    seen = {}

    def spy(graph_module, ctx):
        seen["targets"] = [n.target for n in graph_module.graph.nodes]
        seen["fp8_constants"] = [t.dtype for name, t in graph_module.named_buffers() if "fp8_weight" in name]

    passes = [Fp8Linear(Fp8Config(min_features=16)), kopt.FunctionPass("spy", "look", kopt.Contract.exact(), spy)]
    compiled = kopt.compile(Mlp(torch.bfloat16), passes=passes, lower="eager")
    with torch.no_grad():
        compiled(torch.randn(4, 64).bfloat16())
    targets = seen["targets"]
    assert targets.count(aten._scaled_mm.default) == 2
    assert aten.mm.default not in targets and aten.addmm.default not in targets
    assert targets.count(aten.amax.default) == 2
    assert seen["fp8_constants"] == [torch.float8_e4m3fn, torch.float8_e4m3fn]


def _gemm_kwargs(config: Fp8Config) -> tuple[list[dict], list[str]]:
    """The ``_scaled_mm`` nodes' keyword arguments and the fp8-linear notes for the MLP under ``config``."""
    seen = {}

    def spy(graph_module, ctx):
        seen["kwargs"] = [dict(n.kwargs) for n in graph_module.graph.nodes if n.target is aten._scaled_mm.default]

    passes = [Fp8Linear(config), kopt.FunctionPass("spy", "look", kopt.Contract.exact(), spy)]
    compiled = kopt.compile(Mlp(torch.bfloat16), passes=passes, lower="eager")
    with torch.no_grad():
        compiled(torch.randn(4, 64).bfloat16())
    (record,) = compiled.kopt_report.pass_records("fp8-linear")
    return seen["kwargs"], record.notes


@pytest.mark.parametrize("fast", [True, False])
def test_fast_accumulation_is_requested_unless_turned_off(fast):
    kwargs, _ = _gemm_kwargs(Fp8Config(min_features=16, fast_accum=fast))
    assert len(kwargs) == 2 and all(k.get("use_fast_accum", False) is fast for k in kwargs)


def test_a_device_refusing_fast_accumulation_gets_float32_accumulation_and_a_note(monkeypatch):
    from kopt.passes.fp8 import linear as fp8_linear

    monkeypatch.setattr(fp8_linear, "_fast_accum_refused", lambda device: "RuntimeError: not supported")
    kwargs, notes = _gemm_kwargs(Fp8Config(min_features=16))
    assert len(kwargs) == 2 and not any(k.get("use_fast_accum", False) for k in kwargs)
    assert any("fast FP8 accumulation refused" in note and "not supported" in note for note in notes), notes


class BatchedLinear(torch.nn.Module):
    """A bias-free linear written the way aten's matmul decomposes one whose 3-D input cannot be
    folded to 2-D (FLUX.2's attention output projections): bmm with the transposed weight expanded."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(48, 64) / 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x, self.weight.t().expand(x.shape[0], 64, 48))


def test_a_linear_computed_as_bmm_becomes_an_fp8_gemm():
    seen = {}

    def spy(when):
        def look(graph_module, ctx):
            seen[when] = [n.target for n in graph_module.graph.nodes]
        return kopt.FunctionPass(f"spy-{when}", "look", kopt.Contract.exact(), look)

    module = BatchedLinear()
    passes = [spy("before"), Fp8Linear(Fp8Config(min_features=16)), spy("after")]
    compiled = kopt.compile(module, passes=passes, lower="eager")
    x = torch.randn(2, 10, 64)
    with torch.no_grad():
        out, reference = compiled(x), module(x)
    assert aten.bmm.default in seen["before"]  # the form the capture gives
    assert aten.bmm.default not in seen["after"] and aten._scaled_mm.default in seen["after"]
    assert compiled.kopt_report.matches("fp8-linear") == 1
    assert out.shape == reference.shape and 0 < rel_err(out, reference) < 0.1


def test_block_granularity_uses_the_block_scaled_gemm_and_declines_unaligned_layers():
    seen = {}

    def spy(graph_module, ctx):
        seen["targets"] = [n.target for n in graph_module.graph.nodes]

    config = Fp8Config(granularity="block-128x128", min_features=16)
    passes = [Fp8Linear(config), kopt.FunctionPass("spy", "look", kopt.Contract.exact(), spy)]
    compiled = kopt.compile(Mlp(torch.bfloat16, width=256), passes=passes, lower="eager")
    with torch.no_grad():
        compiled(torch.randn(4, 256).bfloat16())
    assert seen["targets"].count(torch.ops.kopt.fp8_block_mm.default) == 2
    assert aten._scaled_mm.default not in seen["targets"]
    compiled = kopt.compile(Mlp(width=64), passes=[], fp8=config, lower="eager")
    with torch.no_grad():
        compiled(torch.randn(4, 64))
    (record,) = compiled.kopt_report.pass_records("fp8-linear")
    assert record.total_matches == 0
    assert all("divisible by 128" in m.reason for m in record.near_misses)


def test_block_gemm_op_computes_the_dequantized_product_with_its_bias():
    from kopt.passes.fp8.block_mm import reference

    x, w, bias = torch.randn(70, 256), torch.randn(384, 256) / 16, torch.randn(384)
    for granularity, rows in ((Granularity.BLOCK_1X128, 1), (Granularity.BLOCK_128X128, 128)):
        qx, sx = quantize(x, granularity)
        qw, sw = quantize(w, granularity, Operand.WEIGHT)
        out = torch.ops.kopt.fp8_block_mm(qx, sx, qw, sw, bias.bfloat16(), torch.bfloat16, rows)
        exact = fake_quantize(x, granularity).double() @ fake_quantize(w, granularity, Operand.WEIGHT).double().T
        assert out.dtype == torch.bfloat16 and out.shape == (70, 384)
        assert rel_err(out, exact + bias.bfloat16().double()) < 1e-2
        assert rel_err(out, x.double() @ w.double().T + bias.double()) < 0.07
        assert torch.equal(out, reference(qx, sx, qw, sw, bias.bfloat16(), torch.bfloat16))


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("granularity, rows", [(Granularity.BLOCK_1X128, 1), (Granularity.BLOCK_128X128, 128)])
def test_gpu_block_gemm_is_correct_or_refused_per_shape(granularity, rows):
    """cuBLAS' block-scaled GEMM against the definition; shapes it refuses are reported, never wrong."""
    from kopt.passes.fp8.block_mm import cuda_scale_layout, cuda_shape_check, pack_weight_scale, reference

    assert not isinstance(cuda_scale_layout(0, rows), str), cuda_scale_layout(0, rows)
    assert cuda_shape_check(0, 4096, 3072, 3072, rows) is None  # a production shape must be supported
    for m, k, n in ((300, 512, 384), (1, 512, 256), (16, 384, 256), (4608, 6144, 1024)):
        refused = cuda_shape_check(0, m, k, n, rows)
        if refused is not None:
            assert "cuBLAS" in refused
            continue
        x = torch.randn(m, k, device="cuda") * torch.rand(m, 1, device="cuda")
        w = torch.randn(n, k, device="cuda") / k**0.5
        bias = torch.randn(n, device="cuda").bfloat16()
        qx, sx = quantize(x, granularity)
        qw, sw = quantize(w, granularity, Operand.WEIGHT)
        out = torch.ops.kopt.fp8_block_mm(qx, sx, qw, pack_weight_scale(sw, rows), bias, torch.bfloat16, rows)
        assert rel_err(out, reference(qx, sx, qw, sw, bias, torch.float32)) < 1e-2, (m, k, n)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("granularity", ["row", "block-128x128"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # float32: the bias is added after the GEMM
def test_gpu_pass_computes_the_fake_quantized_model(granularity, dtype):
    torch.manual_seed(0)
    mlp = Mlp(dtype, width=512).cuda()  # K = 512, 1024: whole groups of four 128-blocks, as cuBLAS requires
    compiled = kopt.compile(mlp, passes=[], fp8=Fp8Config(granularity=granularity, min_features=16))
    exact = copy.deepcopy(mlp).double()
    with torch.no_grad():
        for seed in (1, 2):
            g = torch.Generator("cuda").manual_seed(seed)
            x = (torch.randn(3, 256, 512, device="cuda", generator=g) + 0.5).to(dtype)
            out, by_hand, truth = compiled(x), simulated(mlp, x, Granularity(granularity)), exact(x.double())
            if dtype == torch.float32:
                assert rel_err(out, by_hand) < 1e-2
            else:
                # Inductor keeps the GELU in float32 inside its fused quantize kernel (the graph rounds it
                # to bf16 first), which moves some values across an FP8 step: the two FP8 models differ
                # by about as much as each differs from the exact one, and kopt's must be no worse.
                assert rel_err(out, by_hand) < 0.03
                assert rel_err(out, truth) < 1.25 * rel_err(by_hand, truth)
    (record,) = compiled.kopt_report.pass_records("fp8-linear")
    assert record.matches == {"fp8-linear": 2}, record.near_misses


def test_skipped_and_small_layers_stay_bf16_with_reasons():
    mlp = Mlp()
    compiled = kopt.compile(mlp, passes=[], fp8=Fp8Config(min_features=16, skip=("down.*",)), lower="eager")
    with torch.no_grad():
        compiled(torch.randn(4, 64))
    (record,) = compiled.kopt_report.pass_records("fp8-linear")
    assert record.matches == {"fp8-linear": 1}
    assert [m.reason for m in record.near_misses] == ["down.weight is skipped by 'down.*'"]
    compiled = kopt.compile(Mlp(), passes=[], fp8=Fp8Config(min_features=100), lower="eager")
    with torch.no_grad():
        compiled(torch.randn(4, 64))
    (record,) = compiled.kopt_report.pass_records("fp8-linear")
    assert record.total_matches == 0
    assert all("smaller than min_features=100" in m.reason for m in record.near_misses)


@pytest.mark.parametrize("name, merged_matches", [("qwen-image", 18), ("flux2", 17)])  # FLUX.2: 2 as bmm
def test_tiny_dits_pass_the_gate_with_merged_siblings_quantized_once(name, merged_matches):
    """fp8=... on "auto": FP8 linears after sibling-merge, the norm fusions kept and made to emit FP8
    (fuse-adaln-quant right after them), the attention-side fusions kept."""
    workload = get_workload(name)
    torch.manual_seed(0)
    model = workload.model("tiny", dtype=torch.bfloat16)
    config = Fp8Config(min_features=16, gate=TINY_GATE)
    compiled = kopt.compile(model, fp8=config, lower="eager", verify=True, strict=True)
    inputs = workload.inputs("tiny", seed=13, dtype=torch.bfloat16)
    with torch.no_grad():
        quality = measure(compiled(**inputs)[0], model(**inputs)[0], TINY_GATE)
    assert quality.passed, quality
    report = compiled.kopt_report
    assert report.graphs[0].fallback is None
    assert report.matches("fp8-linear") == merged_matches
    names = [p.name for p in report.graphs[0].passes]
    assert names.index("sibling-merge") < names.index("fp8-linear") < names.index("bias-absorption")
    assert names.index("fp8-linear") + 1 == names.index("fuse-activation-quant")
    assert names.index("fuse-gated-residual") + 1 == names.index("fuse-adaln-quant")
    assert report.matches("fuse-adaln-quant") > 0 and "fuse-joint-attention-input" in names


def test_skipping_one_merged_sibling_keeps_its_whole_group_in_bf16():
    workload = get_workload("flux2")
    torch.manual_seed(0)
    model = workload.model("tiny")
    config = Fp8Config(min_features=16, skip=("transformer_blocks.0.attn.to_k.weight",))
    compiled = kopt.compile(model, fp8=config, lower="eager")
    with torch.no_grad():
        compiled(**workload.inputs("tiny", seed=2))
    (record,) = compiled.kopt_report.pass_records("fp8-linear")
    reasons = [m.reason for m in record.near_misses if "to_k" in m.reason]
    assert reasons == ["transformer_blocks.0.attn.to_k.weight is skipped by 'transformer_blocks.0.attn.to_k.weight'"
                       " (a merged sibling: all or none are quantized)"]


def test_a_broken_gate_falls_back_to_bf16_under_verify():
    workload = get_workload("qwen-image")
    torch.manual_seed(0)
    model = workload.model("tiny", dtype=torch.bfloat16)
    impossible = Fp8Config(min_features=16, gate=QualityGate(min_cosine=0.999999, min_sqnr_db=80))
    compiled = kopt.compile(model, fp8=impossible, lower="eager", verify=True)
    inputs = workload.inputs("tiny", seed=5, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(compiled(**inputs)[0], model(**inputs)[0])
    assert "verification failed" in compiled.kopt_report.graphs[0].fallback


def test_quality_numbers_agree_with_each_other():
    reference = torch.randn(1000, dtype=torch.float64) + 0.1
    candidate = reference + 0.01 * torch.randn(1000, dtype=torch.float64)
    quality = measure(candidate, reference)
    assert math.isclose(quality.sqnr_db, -20 * math.log10(quality.rel_err))
    assert quality.passed and 0.9999 < quality.cosine < 1
    assert not measure(candidate * float("nan"), reference).passed


def test_sensitivity_scan_orders_layers_and_feeds_the_skip_list():
    workload = get_workload("flux2")
    torch.manual_seed(0)
    model = workload.model("tiny", dtype=torch.bfloat16)
    inputs = workload.inputs("tiny", seed=9, dtype=torch.bfloat16)
    config = Fp8Config(min_features=16)
    scan = scan_sensitivity(model, inputs, config)
    assert len(scan) > 10
    sqnrs = [r.quality.sqnr_db for r in scan]
    assert sqnrs == sorted(sqnrs) and all(math.isfinite(s) and s > 10 for s in sqnrs)
    kept = keep_in_bf16(config, scan, 2)
    assert kept.skip == (scan[0].path, scan[1].path)
    with torch.no_grad():  # the scan left the model untouched
        before = model(**inputs)[0]
        scan_sensitivity(model, inputs, config)
        assert torch.equal(model(**inputs)[0], before)
