"""Hardware ceilings measured in the same run, FLOP counts, and the per-model floor they imply.

The ceilings (GPU only) say how fast the card can go at the three things a DiT forward is made of:
moving bytes (a large device-to-device copy), bf16 GEMM and FP8 GEMM (8192³ on random data, since
zeros can run faster through power-gating). A model's *floor* is its GEMM FLOPs at the bf16 / FP8
GEMM ceiling plus its measured attention time: no variant that keeps the math can go below it by
speeding up GEMMs alone, so (measured - floor) is the room left for fusion and overlap.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.dit.measure import time_call_ms

GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_int_mm", "convolution")


def _median_ms(fn: Callable[[], Any], device: torch.device, warmup: int = 3, repeats: int = 10) -> float:
    for _ in range(warmup):
        fn()
    return statistics.median(time_call_ms(fn, device) for _ in range(repeats))


def copy_bandwidth_tbs(device: torch.device, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy of ``nbytes``: TB/s counting bytes read plus bytes written."""
    src = torch.randn(nbytes // 2, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src), device)
    return 2 * nbytes / (ms * 1e-3) / 1e12


def bf16_matmul_tflops(device: torch.device, n: int = 8192) -> float:
    """``torch.matmul`` of two random n×n bf16 matrices."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms = _median_ms(lambda: torch.matmul(a, b), device)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def fp8_matmul_tflops(device: torch.device, n: int = 8192, rowwise: bool = True) -> float:
    """``torch._scaled_mm`` of random n×n float8_e4m3fn matrices to bf16 (rowwise or tensorwise scales)."""
    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)  # row-major; b.t() is column-major
    if rowwise:
        scale_a = torch.rand(n, 1, device=device) + 0.5
        scale_b = torch.rand(1, n, device=device) + 0.5
    else:
        scale_a = scale_b = torch.tensor(1.0, device=device)
    ms = _median_ms(lambda: torch._scaled_mm(a, b.t(), scale_a=scale_a, scale_b=scale_b,
                                             out_dtype=torch.bfloat16), device)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def measure_ceilings(device: torch.device) -> dict[str, Any] | None:
    """All ceilings on a GPU; None on the CPU (the tiny smoke mode has no meaningful ceilings)."""
    if device.type != "cuda":
        return None
    result: dict[str, Any] = {
        "copy_tbs": copy_bandwidth_tbs(device),
        "bf16_matmul_tflops": bf16_matmul_tflops(device),
        "fp8_rowwise_scaled_mm_tflops": fp8_matmul_tflops(device, rowwise=True),
        "fp8_tensorwise_scaled_mm_tflops": fp8_matmul_tflops(device, rowwise=False),
        "method": "median of 10 after 3 warm-up; copy 2 GiB bf16 (read+write bytes); "
                  "matmuls 8192^3 on torch.randn data",
    }
    torch.cuda.empty_cache()
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()}


def _linear_hooks(model: nn.Module, counter: list[int]) -> list[Any]:
    """Forward hooks adding 2·rows·in·out per nn.Linear call: the analytic linear-layer FLOPs."""
    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        x = args[0]
        counter[0] += 2 * (x.numel() // module.in_features) * module.in_features * module.out_features

    return [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Linear)]


def count_flops(model: nn.Module, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """FLOPs of one forward, counted by ``torch.utils.flop_counter.FlopCounterMode`` per aten op.

    GEMM = mm/addmm/bmm/baddbmm/_scaled_mm/convolution; attention = ops whose name contains
    "attention" (the fused SDPA kernels). ``linear_flops_analytic`` cross-checks GEMM with hooks
    on every nn.Linear (2·rows·in·out); if SDPA fell back to the math path its bmm FLOPs would
    land in GEMM, which the per-op dict makes visible.
    """
    linear = [0]
    hooks = _linear_hooks(model, linear)
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(**inputs)
    finally:
        for handle in hooks:
            handle.remove()
    by_op = {str(op).removeprefix("aten."): int(n) for op, n in counter.get_flop_counts()["Global"].items()}
    gemm = sum(n for op, n in by_op.items() if op.split(".")[0] in GEMM_OPS)
    attention = sum(n for op, n in by_op.items() if "attention" in op)
    return {
        "method": "FlopCounterMode (one eager forward); GEMM vs attention split by aten op",
        "total": sum(by_op.values()),
        "gemm": gemm,
        "attention": attention,
        "other": sum(by_op.values()) - gemm - attention,
        "linear_flops_analytic": linear[0],
        "by_op": by_op,
    }


def floors(flops: Mapping[str, Any] | None, ceilings: Mapping[str, Any] | None,
           attention_ms: float | None) -> dict[str, Any] | None:
    """GEMM FLOPs at the bf16 and FP8 ceilings, plus measured eager attention time (ms)."""
    if not flops or not ceilings:
        return None
    gemm = flops["gemm"]
    bf16_ms = gemm / (ceilings["bf16_matmul_tflops"] * 1e12) * 1e3
    fp8_ms = gemm / (ceilings["fp8_rowwise_scaled_mm_tflops"] * 1e12) * 1e3
    attention = attention_ms if attention_ms is not None else 0.0
    return {
        "gemm_tflop": round(gemm / 1e12, 3),
        "gemm_ms_at_bf16_ceiling": round(bf16_ms, 3),
        "gemm_ms_at_fp8_ceiling": round(fp8_ms, 3),
        "attention_ms_eager_measured": attention_ms,
        "floor_bf16_ms": round(bf16_ms + attention, 3),
        "floor_fp8_ms": round(fp8_ms + attention, 3),
        "note": "floor = GEMM FLOPs (FlopCounterMode) / ceiling + eager attention kernel time"
                + ("" if attention_ms is not None else " (attention not profiled: counted as 0)"),
    }
