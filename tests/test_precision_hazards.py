"""Precision hazards: a low-precision value scaled into a sinusoid, found by what the graph computes."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import torch

import kopt
from kopt.fx.capture import trace_function
from kopt.fx.precision_hazards import HazardKind, PrecisionHazard, find_precision_hazards
from tests import tiny_flux1
from tests.conftest import tiny_model_and_inputs

ROOT = Path(__file__).resolve().parent.parent


def _hazards(model: torch.nn.Module, inputs: dict) -> list[PrecisionHazard]:
    compiled = kopt.compile(model, passes=["redundancy"], lower="eager")
    with torch.no_grad():
        compiled(**inputs)
    return [h for graph in compiled.kopt_report.graphs for h in graph.hazards]


def test_flux1_guidance_3_5_is_found_with_its_rounding():
    """FLUX.1 in bf16 scales timestep and guidance by 1000 in bf16 before the sinusoid: both are
    found, and the guidance one says 3500 -> 3504 (error 4, bf16 step 16 there)."""
    model, inputs = tiny_flux1.model_and_inputs(torch.bfloat16, guidance=3.5)
    found = {h.source: h for h in _hazards(model, inputs)}
    assert set(found) == {"L['kwargs']['timestep']", "L['kwargs']['guidance']"}
    guidance = found["L['kwargs']['guidance']"]
    assert guidance.kind is HazardKind.LOW_PRECISION_SCALED_SINUSOID
    assert (guidance.magnitude, guidance.example, guidance.step, guidance.scale) == (4.0, (3500.0, 3504.0), 16.0, 1000)
    assert guidance.dtype == "bfloat16" and {s.split()[1] for s in guidance.sinks} == {"(sin)", "(cos)"}
    assert found["L['kwargs']['timestep']"].magnitude == 0.0  # t = 0.5: 500 is exact in bf16
    assert "emulate_precision_casts" in guidance.inductor and "3500 -> 3504" in guidance.describe()


def test_no_hazard_where_nothing_is_rounded():
    """FLUX.1 in float32 (the product is not rounded to a low precision) and Qwen-Image in bf16 (it
    casts its timestep to float32 before scaling it): nothing to report."""
    model, inputs = tiny_flux1.model_and_inputs(torch.float32, guidance=3.5)
    assert _hazards(model, inputs) == []
    torch._dynamo.reset()
    _workload, qwen, qwen_inputs = tiny_model_and_inputs("qwen-image", seed=3, dtype=torch.bfloat16)
    assert _hazards(qwen, qwen_inputs) == []


def test_matching_is_by_computation_not_by_names():
    """A plain function with the same arithmetic is found; a small scale, a float32 product, or a
    product that never reaches a sinusoid are not."""
    def embed(g, scale, dtype, sinusoid):
        scaled = g.to(dtype) * scale
        freqs = torch.exp(-torch.arange(4, dtype=torch.float32))
        phase = scaled[:, None].float() * freqs[None]
        return torch.cat([phase.sin(), phase.cos()], -1) if sinusoid else phase.tanh()

    g = torch.tensor([3.5])
    hazardous = dict(scale=1000.0, dtype=torch.bfloat16, sinusoid=True)
    found = find_precision_hazards(trace_function(functools.partial(embed, **hazardous), g), [g])
    assert [(h.example, h.magnitude) for h in found] == [((3500.0, 3504.0), 4.0)]
    for change in (dict(scale=8.0), dict(dtype=torch.float32), dict(sinusoid=False)):
        harmless = functools.partial(embed, **{**hazardous, **change})
        assert find_precision_hazards(trace_function(harmless, g), [g]) == []


def test_kopt_explain_names_the_hazard_in_text_and_json():
    """``kopt explain module:factory`` on a tiny FLUX.1 (bf16): a report section and the JSON record."""
    target = "tests.tiny_flux1:workload"
    text = subprocess.run(["kopt", "explain", target, "--dtype", "bf16"], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert text.returncode == 0, text.stderr[-2000:]
    assert "precision hazards (2)" in text.stdout and "3500 -> 3504 in bfloat16" in text.stdout
    assert "2 precision hazard(s)" in text.stdout
    result = subprocess.run([sys.executable, "-m", "kopt.cli", "explain", target, "--dtype", "bf16", "--json"],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    decoded = json.loads(result.stdout)
    (guidance,) = [h for h in decoded["hazards"] if h["magnitude"]]
    assert guidance["kind"] == "low-precision value scaled into a sinusoid" and guidance["example"] == [3500.0, 3504.0]
    assert guidance["node"] in {h["node"] for h in decoded["report"]["graphs"][0]["hazards"]}
    # against the reference and against eager: eager bf16 itself is 1e-2 off (the rounded guidance)
    assert {"rel_err", "cosine", "rel_err_vs_eager", "cosine_vs_eager", "eager_cosine"} <= set(decoded)
    assert decoded["eager_rel_err"] > 1e-2
