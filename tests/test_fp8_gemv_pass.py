"""fp8-gemv: a row-scaled FP8 GEMM of a few rows with a large constant weight becomes kopt::fp8_gemv
(the modulation of a timestep embedding); everything else is left to cuBLAS, with the reason."""

from __future__ import annotations

import torch

import kopt
from kopt.fp8 import Fp8Config
from tests.conftest import rel_err

CONFIG = Fp8Config(min_features=16)


class Modulation(torch.nn.Module):
    """A timestep embedding times one large modulation weight (8 MiB in FP8), and a small linear."""

    def __init__(self) -> None:
        super().__init__()
        self.large = torch.nn.Linear(1024, 8192)
        self.small = torch.nn.Linear(1024, 64)

    def forward(self, temb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.nn.functional.silu(temb)
        return self.large(h), self.small(h)


def _model_and_input(rows: int, seed: int) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    model = Modulation().to(torch.bfloat16).eval()
    return model, torch.randn(rows, 1024, dtype=torch.bfloat16)


def _run(model: torch.nn.Module, x: torch.Tensor, passes: list[str], lower: str = "eager"
         ) -> tuple[tuple[torch.Tensor, ...], kopt.KoptModule]:
    compiled = kopt.compile(model, passes=passes, fp8=CONFIG, lower=lower)
    with torch.no_grad():
        return compiled(x), compiled


def test_a_one_row_gemm_with_a_large_weight_becomes_the_gemv_and_computes_the_same():
    model, x = _model_and_input(1, seed=1)
    (large, small), compiled = _run(model, x, ["fp8-linear", "fp8-gemv"])
    (record,) = compiled.kopt_report.pass_records("fp8-gemv")
    assert record.matches == {"fp8-gemv": 1}
    assert any("below 8 MiB" in str(miss) for miss in record.near_misses), record.near_misses
    (large_mm, small_mm), _ = _run(model, x, ["fp8-linear"])
    assert rel_err(large, large_mm) < 1e-2 and torch.equal(small, small_mm)
    with torch.no_grad():
        eager_large, _ = model(x)
    assert rel_err(large, eager_large) < 0.06  # FP8's own error, against the bf16 linear


def test_more_rows_than_a_gemv_takes_are_not_candidates():
    model, x = _model_and_input(16, seed=2)
    _, compiled = _run(model, x, ["fp8-linear", "fp8-gemv"])
    (record,) = compiled.kopt_report.pass_records("fp8-gemv")
    assert record.matches == {} and not record.near_misses


def test_auto_with_row_scales_runs_it_last_before_staging_and_through_inductor():
    """``fp8=...`` on ``"auto"`` adds fp8-gemv right before staging; the op survives Inductor's lowering."""
    from kopt.passes.pipeline import resolve

    names = [p.name for p in resolve("auto", CONFIG)]
    assert names.index("fp8-gemv") + 1 == names.index("staging")
    assert "fp8-gemv" not in [p.name for p in resolve("auto", Fp8Config(granularity="tensor"))]
    model, x = _model_and_input(1, seed=3)
    (large, _), compiled = _run(model, x, "auto", lower="inductor")
    assert compiled.kopt_report.matches("fp8-gemv") == 1
    with torch.no_grad():
        assert rel_err(large, model(x)[0]) < 0.06
    # Inductor fuses SiLU into the quantization without rounding to bf16 between them (so it differs
    # from the eager-lowered graph's FP8 values): compare like with like
    (large_mm, _), _ = _run(model, x, ["fp8-linear"], lower="inductor")
    assert rel_err(large, large_mm) < 1e-2
