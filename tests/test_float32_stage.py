"""A small step-invariant stage is computed op by op in float32 instead of being lowered by Inductor
(``kopt/fx/float32_stage.py``): low-precision ops compute in float32 and the outputs are rounded once,
in the dtypes and layouts the per-call stage was compiled for; a float32 model's explicit choices stay
as written; a stage too large, or one that cannot be computed so, is lowered as before."""

from __future__ import annotations

import math

import torch

import kopt
from kopt.fx.float32_stage import (
    MAX_CONSTANT_BYTES,
    MAX_GEMM_FLOPS,
    Float32Stage,
    computed_in_float32,
)
from kopt.reference import reference_forward
from tests.conftest import rel_err
from tests.test_opaque_blocks import _flux1


def _embedding(guidance: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FLUX.1's guidance path in miniature: the value rounded to bf16, scaled by 1000, into a sinusoid and
    a linear; a transposed output, so the layout given back matters."""
    scaled = guidance.to(torch.bfloat16) * 1000
    freqs = torch.exp(-math.log(10000) * torch.arange(16, dtype=torch.float32) / 16)
    phases = scaled[:, None].float() * freqs[None, :]
    features = torch.cat([torch.sin(phases), torch.cos(phases)], dim=-1).to(torch.bfloat16)
    return features @ weight, features.t()


def test_low_precision_ops_compute_in_float32_and_round_once_in_the_working_layout():
    graph_module = torch.fx.symbolic_trace(_embedding)
    guidance = 3.0 + torch.rand(3)  # 3000..4000 after the scale: bf16's step there is 16
    weight = torch.randn(32, 8, dtype=torch.bfloat16)
    working = graph_module(guidance, weight)
    stage = Float32Stage(graph_module, like=working)
    outs = stage(guidance, weight)
    # the same computation without any rounding, in float64
    phases = (guidance.double() * 1000)[:, None] * torch.exp(-math.log(10000) * torch.arange(16).double() / 16)
    features = torch.cat([torch.sin(phases), torch.cos(phases)], dim=-1)
    for out, like, want in zip(outs, working, (features @ weight.double(), features.t()), strict=True):
        assert out.dtype == like.dtype and out.shape == like.shape and out.stride() == like.stride()
        assert rel_err(out, want) <= 2 ** -8  # one rounding to bf16
    # eager's product rounded to bf16 before the sinusoid is far off at these magnitudes
    assert rel_err(working[1], features.t()) > 10 * rel_err(outs[1], features.t())


def _sinusoid(timestep: torch.Tensor) -> tuple[torch.Tensor]:
    """A float32 model's timestep embedding: its own float32 sinusoid of a value in the thousands (a
    tuple, as a stage returns)."""
    freqs = torch.exp(-math.log(10000) * torch.arange(16, dtype=torch.float32) / 16)
    phases = (timestep * 1000)[:, None].float() * freqs[None, :]
    return (torch.cat([torch.sin(phases), torch.cos(phases)], dim=-1),)


def test_a_float32_stage_computes_what_it_computes_eagerly():
    """float32 is the model's own choice here: kept, where float64 would move the sinusoid."""
    graph_module = torch.fx.symbolic_trace(_sinusoid)
    timestep = 0.5 + torch.rand(4)
    (working,) = graph_module(timestep)
    (out,) = Float32Stage(graph_module, like=[working])(timestep)
    assert out.dtype == torch.float32 and rel_err(out, working) < 1e-6
    # what computing it in float64 (the reference's dtype on the CPU) would give instead
    phases = (timestep.double() * 1000)[:, None] * torch.exp(-math.log(10000) * torch.arange(16).double() / 16)
    in_float64 = torch.cat([torch.sin(phases), torch.cos(phases)], dim=-1).float()
    assert rel_err(in_float64, working) > 10 * max(rel_err(out, working), 1e-8)


def test_only_a_small_stage_skips_the_lowering():
    assert computed_in_float32(3.1e6, 21 << 20)  # FLUX.1's
    assert not computed_in_float32(MAX_GEMM_FLOPS * 2, 0)  # a whole model's modulation GEMMs
    assert not computed_in_float32(0, MAX_CONSTANT_BYTES + 1)


def test_a_compiled_models_small_stage_is_computed_in_float32_and_said_so():
    """Tiny FLUX.1 with its own code compiled by Inductor: the guidance and position tables' stage runs in
    float32; the output stays several times closer to the float32 reference than eager's."""
    model, inputs = _flux1(dtype=torch.bfloat16)
    with torch.no_grad():
        exact = reference_forward(model, **inputs)[0]
        eager = model(**inputs)[0]
        compiled = kopt.compile(model, regional=True, between_blocks="compiled", progress=False)
        first, again = compiled(**inputs)[0], compiled(**inputs)[0]  # a memo miss, then a hit
    (outer,) = [g for g in compiled.kopt_report.graphs if g.memo is not None]
    notes = [n for p in outer.passes for n in p.notes]
    assert any("computed op by op in float32, not lowered" in n for n in notes), notes
    assert outer.memo.hits >= 1 and outer.lowering_check is not None and outer.lowering_check.ok
    assert rel_err(again, first) < 1e-3  # the memo's hit gives the stage's values back
    assert rel_err(first, exact) * 4 < rel_err(eager, exact)
    assert "per-call stage run as FX, not lowered" in outer.lowering  # nothing in it for Inductor to fuse
    assert "nothing in this graph was lowered" in outer.lowering_check.note  # so no lowering to check
    compiled.undo()


def test_a_stage_that_cannot_be_computed_so_is_lowered_as_before_and_said_so(monkeypatch):
    """An op the reference's machinery refuses (a bit reinterpretation of a float, an in-place write
    into a stored low-precision tensor: ``ReferenceUnavailable``) is found by the trial run at compile
    time: the stage is lowered by Inductor as any other, the report says why, the output is right."""
    import kopt.fx.float32_stage
    from kopt.reference import ReferenceUnavailable

    def refused(*args, **kwargs):
        raise ReferenceUnavailable("aten.view.dtype reinterprets the bits of a bfloat16 tensor")

    monkeypatch.setattr(kopt.fx.float32_stage, "run_reference", refused)
    model, inputs = _flux1(dtype=torch.bfloat16)
    with torch.no_grad():
        exact = reference_forward(model, **inputs)[0]
        eager = model(**inputs)[0]
        compiled = kopt.compile(model, regional=True, between_blocks="compiled", progress=False)
        got = compiled(**inputs)[0]
    notes = [n for g in compiled.kopt_report.graphs for p in g.passes for n in p.notes]
    assert any("lowered: computing it op by op in float32 failed (ReferenceUnavailable" in n for n in notes), notes
    assert rel_err(got, exact) * 4 < rel_err(eager, exact)  # Inductor's stage: the guidance still exact
    compiled.undo()
