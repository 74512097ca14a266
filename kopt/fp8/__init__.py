"""FP8 inference: configuration, the one quantization definition, and the quality gate.

    from kopt.fp8 import Fp8Config
    fast = kopt.compile(model, fp8=Fp8Config(granularity="row", skip=("proj_out.*",)), verify=True)
"""

from kopt.fp8.config import Fp8Config, Granularity, QualityGate
from kopt.fp8.quality import GateVerdict, Quality, judge, measure
from kopt.fp8.quantize import fake_quantize, quantize
from kopt.fp8.sensitivity import LayerSensitivity, keep_in_bf16, scan_sensitivity

__all__ = ["Fp8Config", "GateVerdict", "Granularity", "LayerSensitivity", "Quality", "QualityGate", "fake_quantize",
           "judge", "keep_in_bf16", "measure", "quantize", "scan_sensitivity"]
