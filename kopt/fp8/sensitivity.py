"""Layer sensitivity: which linears cost the most output quality when quantized to FP8.

Each selected ``nn.Linear`` is quantized alone (its weight and its input fake-quantized with the
config's granularity, exactly the values the FP8 GEMM multiplies) while every other layer stays in
its original dtype; the model's output is compared with the unquantized output (SQNR, cosine).
The layers with the lowest SQNR are the ones to keep in bf16: :func:`keep_in_bf16` adds the worst
``count`` of them to the config's ``skip`` list. Cost: one forward per selected layer, on the
caller's inputs (use the workload's real inputs, not zeros).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from kopt.fp8.config import Fp8Config, Granularity
from kopt.fp8.quality import Quality, measure
from kopt.fp8.quantize import Operand, fake_quantize


@dataclasses.dataclass(frozen=True)
class LayerSensitivity:
    """The model's output quality with only the linear whose weight is ``path`` in FP8."""

    path: str
    quality: Quality


def _first_tensor(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output:
        return _first_tensor(output[0])
    sample = getattr(output, "sample", None)
    if isinstance(sample, torch.Tensor):
        return sample
    raise TypeError(f"cannot find the output tensor in a {type(output).__name__}")


def candidate_linears(model: torch.nn.Module, config: Fp8Config) -> dict[str, torch.nn.Linear]:
    """Weight path → linear for every ``nn.Linear`` the config would quantize."""
    found = {}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        path = f"{name}.weight" if name else "weight"
        out_features, in_features = module.weight.shape
        if config.selects(path) is None and min(out_features, in_features) >= config.min_features \
                and in_features % 16 == 0 and out_features % 16 == 0:
            found[path] = module
    return found


def scan_sensitivity(model: torch.nn.Module, inputs: Mapping[str, Any], config: Fp8Config | None = None,
                     output: Callable[[Any], torch.Tensor] = _first_tensor) -> list[LayerSensitivity]:
    """Quantize each selected linear alone and measure the output; worst (lowest SQNR) first."""
    config = config or Fp8Config()
    granularity = Granularity(config.granularity)
    with torch.no_grad():
        reference = output(model(**inputs)).clone()
        results = []
        for path, linear in candidate_linears(model, config).items():
            original = linear.weight.data
            hook = linear.register_forward_pre_hook(
                lambda _module, args: (fake_quantize(args[0], granularity), *args[1:]))
            try:
                linear.weight.data = fake_quantize(original, granularity, Operand.WEIGHT)
                quality = measure(output(model(**inputs)), reference, config.gate)
            finally:
                linear.weight.data = original
                hook.remove()
            results.append(LayerSensitivity(path, quality))
    return sorted(results, key=lambda r: r.quality.sqnr_db)


def keep_in_bf16(config: Fp8Config, scan: list[LayerSensitivity], count: int) -> Fp8Config:
    """``config`` with the ``count`` most sensitive layers of ``scan`` added to ``skip``."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    worst = [r.path for r in scan[:count]]
    return dataclasses.replace(config, skip=config.skip + tuple(worst))
