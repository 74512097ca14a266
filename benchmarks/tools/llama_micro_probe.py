"""Llama-3.1-8B prefill on one GPU, three probes in one process (``llama-breakdown-s23a.json``):

* each SDPA backend at the attention's shape (q [1, 32, 2048, 128], k and v [1, 8, 2048, 128], causal),
  with ``enable_gqa`` and with the key/value heads repeated (median of 50 CUDA-event timings, ms);
* the LM head's GEMM (2,048 x 4,096 x 128,256) in bf16, and in FP8 with per-row scales, the
  activation's quantization included (``_scaled_mm`` with fast accumulation);
* ``kopt.compile(passes="auto", regional=True)``: median ms per forward (CUDA events, 20 calls) and the
  profiler's kernel time per forward, by kernel (3 forwards).

Random weights, the published configuration (``kopt.workloads``). Timings only: no output is judged
here (the agent's runs judge quality against the fp32 reference).

    python -m benchmarks.tools.llama_micro_probe --out benchmarks/results/llama-breakdown-s23a.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def median_ms(fn, n: int = 50, warmup: int = 5) -> float:
    """Median of ``n`` CUDA-event timings of ``fn`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(n):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def attention_ms() -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 32, 2048, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8, 2048, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    found = {}
    for name, backend in [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH)]:
        for gqa in (True, False):
            key, value = (k, v) if gqa else (k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
            label = f"{name}{'-gqa' if gqa else '-rep'}"
            try:
                with sdpa_kernel(backend):
                    found[label] = median_ms(lambda: F.scaled_dot_product_attention(  # noqa: B023
                        q, key, value, is_causal=True, enable_gqa=gqa))  # noqa: B023
            except Exception as error:  # noqa: BLE001 - "No available kernel": recorded as such
                found[label] = str(error)[:120]
    return found


def lm_head_ms() -> dict:
    x = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128256, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    found = {"bf16": median_ms(lambda: x @ w.t())}
    w_scale = w.abs().amax(1, keepdim=True).float() / 448
    w_fp8 = (w / w_scale).to(torch.float8_e4m3fn)

    def fp8() -> torch.Tensor:
        x_scale = x.abs().amax(1, keepdim=True).float() / 448
        x_fp8 = (x / x_scale).to(torch.float8_e4m3fn)
        return torch._scaled_mm(x_fp8, w_fp8.t(), scale_a=x_scale, scale_b=w_scale.t(), out_dtype=torch.bfloat16,
                                use_fast_accum=True)

    found["fp8_row_incl_quant"] = median_ms(fp8)
    return found


def kernels_per_forward(fn, calls: int = 3) -> list:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = [(e.device_time_total / calls / 1000, e.count // calls, e.key[:110]) for e in prof.key_averages()
            if e.device_time_total > 0]
    return sorted(rows, reverse=True)


def main() -> None:
    import kopt
    from kopt.workloads import get_workload

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    out = {"attention_ms": attention_ms(), "lm_head_ms": lm_head_ms()}
    print(out, flush=True)
    workload = get_workload("llama")
    model = workload.model("full", device="cuda", dtype=torch.bfloat16)
    inputs = workload.inputs("full", device="cuda", dtype=torch.bfloat16)
    compiled = kopt.compile(model, passes="auto", regional=True)
    with torch.no_grad():
        for _ in range(4):
            compiled(**inputs)
        out["kopt_auto_ms"] = median_ms(lambda: compiled(**inputs), 20)
        out["replay"] = str(getattr(getattr(compiled, "_replay", None), "stats", None))[:400]
        rows = kernels_per_forward(lambda: compiled(**inputs))
    out["kernels_ms_per_forward"] = rows[:25]
    out["kernel_total_ms"] = sum(r[0] for r in rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "kernels_ms_per_forward"}, indent=1))


if __name__ == "__main__":
    main()
