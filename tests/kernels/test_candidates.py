"""Every candidate launch config the autotuner may pick is correct: each kernel runs under each of its
candidates (those of the production shapes and of small ones) in the interpreter, on small awkward
shapes (row counts not a multiple of ROWS_PER_PROGRAM, widths not a power of two, several batches),
with fresh random inputs and poisoned outputs, against the reference by relative error."""

from __future__ import annotations

import zlib

import pytest
import torch

from kopt.kernels import activation_quant, adaln_modulation, gated_residual, gelu_tanh, qk_norm_rope, swiglu
from kopt.kernels._autotune import config_name
from tests.conftest import rel_err
from tests.kernels.fp8_checks import assert_fp8_matches

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _unique(*lists):
    out = []
    for config in (c for lst in lists for c in lst):
        if config not in out:
            out.append(config)
    return out


def _params(configs):
    return [pytest.param(c, id=config_name(c)) for c in configs]


def _gen(config, *key):
    return torch.Generator().manual_seed(zlib.crc32(repr((config_name(config), key)).encode()))


def _dtype(config):  # alternate float32 / bfloat16 across configs
    return (torch.float32, torch.bfloat16)[zlib.crc32(config_name(config).encode()) % 2]


# rows of 3000 (BLOCK_N 4096, the production candidates) and of 257 (BLOCK_N 512, many rows per program)
ROW_CONFIGS = _unique(adaln_modulation.candidates(3000, 4096), adaln_modulation.candidates(257, 1 << 16))
ROW_SHAPES = [(2, 7), (1, 13), (3, 4)]  # straddling batches, one batch, S a multiple of small R


def _row_n(config):
    return 3000 if config["BLOCK_N"] == 4096 else 257


def test_row_candidates_cover_several_rows_per_program():
    assert ROW_CONFIGS[0] == {"ROWS_PER_PROGRAM": 1, "BLOCK_N": 4096, "num_warps": 8}  # the old heuristic
    assert {c["ROWS_PER_PROGRAM"] for c in ROW_CONFIGS} >= {1, 2, 4, 8, 16}
    assert gated_residual.candidates(3000, 4096) == adaln_modulation.candidates(3000, 4096)


@pytest.mark.parametrize("config", _params(ROW_CONFIGS))
def test_adaln_modulation_every_candidate(config):
    n, dtype = _row_n(config), _dtype(config)
    for b, s in ROW_SHAPES:
        for rms in (False, True):
            g = _gen(config, b, s, rms)
            x = (torch.randn(b, s, n, generator=g) * 3 + 0.5).to(dtype)
            scale, shift = (torch.randn(b, n, generator=g) * 0.5).to(dtype), torch.randn(b, 1, n, generator=g)
            weight = (torch.randn(n, generator=g) * 0.2 + 1).to(dtype) if rms else None
            out = torch.full_like(x, float("nan"))
            adaln_modulation.launch(x, scale, shift, weight, rms=rms, out=out, config=config)
            ref = adaln_modulation.reference(x, scale, shift, weight, rms=rms)
            assert rel_err(out, ref) < TOL[dtype], (b, s, rms)


@pytest.mark.parametrize("config", _params(ROW_CONFIGS))
def test_gated_residual_every_candidate(config):
    n, dtype = _row_n(config), _dtype(config)
    for b, s in ROW_SHAPES:
        g = _gen(config, b, s)
        r = (torch.randn(b, s, n, generator=g) * 3 + 0.5).to(dtype)
        y = torch.randn(b, s, n, generator=g).to(dtype)
        gate, scale, shift = (torch.randn(b, n, generator=g).to(dtype) for _ in range(3))
        outs = (torch.full_like(r, float("nan")), torch.full_like(r, float("nan")))
        gated_residual.launch(r, y, gate, scale, shift, out=outs, config=config)
        for out, ref in zip(outs, gated_residual.reference(r, y, gate, scale, shift), strict=True):
            assert rel_err(out, ref) < TOL[dtype], (b, s)


# head dim 128 (the production candidates) and 48 (not a power of two: BLOCK_HALF 32 > 24 pairs)
QK_CONFIGS = _unique(qk_norm_rope.candidates(64, 1 << 17), qk_norm_rope.candidates(24, 1 << 17))


@pytest.mark.parametrize("config", _params(QK_CONFIGS))
def test_qk_norm_rope_every_candidate(config):
    d, dtype = 2 * {64: 64, 32: 24}[config["BLOCK_HALF"]], _dtype(config)
    for (b, s, h), mode in (((1, 5, 3), "complex"), ((2, 3, 5), "real")):
        g = _gen(config, b, s, h, mode)
        x = (torch.randn(b, s, h, d, generator=g) * 2 + 0.3).to(dtype)
        weight = (torch.randn(d, generator=g) * 0.2 + 1).to(dtype) if mode == "complex" else None
        angles = torch.rand(s, d // 2, generator=g) * 6.28
        if mode == "complex":
            cos, sin = qk_norm_rope.cos_sin_from_complex(torch.polar(torch.ones_like(angles), angles))
        else:
            cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
        out = torch.full_like(x, float("nan"))
        qk_norm_rope.launch(x, weight, cos, sin, 1e-6, mode, out=out, config=config)
        assert rel_err(out, qk_norm_rope.reference(x, weight, cos, sin, 1e-6, mode)) < TOL[dtype], mode


GELU_CONFIGS = _unique(gelu_tanh.candidates(1 << 26, torch.bfloat16), gelu_tanh.candidates(1 << 26, torch.float32),
                       gelu_tanh.candidates(1000, torch.float32))


@pytest.mark.parametrize("config", _params(GELU_CONFIGS))
def test_gelu_tanh_every_candidate(config):
    dtype = _dtype(config)
    x = (torch.randn(3, 7001, generator=_gen(config)) * 2 + 0.1).to(dtype)  # 21003: no block divides it
    out = torch.full_like(x, float("nan"))
    gelu_tanh.launch(x, out=out, config=config)
    assert rel_err(out, gelu_tanh.reference(x)) < TOL[dtype]


SWIGLU_CONFIGS = _unique(swiglu.candidates(18432, torch.bfloat16), swiglu.candidates(97, torch.float32))


@pytest.mark.parametrize("config", _params(SWIGLU_CONFIGS))
def test_swiglu_every_candidate(config):
    dtype = _dtype(config)
    f = 1500 if config["BLOCK"] > 128 else 97
    h = (torch.randn(2, 3, 2 * f, generator=_gen(config)) * 2 + 0.1).to(dtype)
    out = torch.full((2, 3, f), float("nan"), dtype=dtype)
    swiglu.launch(h, out=out, config=config)
    assert rel_err(out, swiglu.reference(h)) < TOL[dtype]


ACTIVATION_QUANT_CONFIGS = _unique(activation_quant.candidates(6144 + 18432), activation_quant.candidates(12288),
                                   activation_quant.candidates(100))


def test_activation_quant_candidates_start_with_the_old_config():
    assert ACTIVATION_QUANT_CONFIGS[0] == activation_quant.DEFAULT_CONFIG
    assert {c["num_warps"] for c in ACTIVATION_QUANT_CONFIGS} == {4, 8, 16, 32}


@pytest.mark.parametrize("config", _params(ACTIVATION_QUANT_CONFIGS))
def test_activation_quant_every_candidate(config):
    f, p, rows = 1500, 700, 3  # neither divides any block: every step masks
    if config.get("PREFETCH"):  # the row must fit one block; more rows than programs (4 per SM-count on the CPU)
        f, rows = min(f, config["BLOCK"] - 5), 4 * config["PREFETCH"] * 2 + 3
    if config.get("IN_REGISTERS"):  # 2..5 register chunks per row: here 3, the last one partial
        f = 2 * config["BLOCK"] + 100
    g = _gen(config)
    for act in ("swiglu", "gelu_tanh"):
        h = (torch.randn(rows, 2 * f if act == "swiglu" else f, generator=g) * 3).float()
        prefix = torch.randn(rows, p, generator=g) * 0.5
        q, scale = activation_quant.launch(h, prefix, act, config=config)
        q_ref, scale_ref = activation_quant.reference(h, prefix, act)
        # not exact: over this many values the interpreter also truncates a few FP8 subnormals
        assert_fp8_matches(q, scale, q_ref, scale_ref, exact=False)
