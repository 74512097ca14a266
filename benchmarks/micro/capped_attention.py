#!/usr/bin/env python3
"""Soft-capped attention at Gemma 2's prefill shapes: kopt's fused kernel (every launch config) against
the spelled-out attention the model runs (eager, and compiled by Inductor as a regional compile lowers
it), with each one's error against float32; torch's SDPA without the cap as the price of attention
that needs no cap (a different computation: its error is not comparable).

    python benchmarks/micro/capped_attention.py          # on the GPU: capped_attention.{json,md}
                                                         # under $OUT or benchmarks/results
    python benchmarks/micro/capped_attention.py --tiny   # CPU smoke run (interpreter, small shapes; times mean nothing)

Times are CUDA-graph replays (GPU time only, median) of one call; the fused kernel's time includes its
mask scan. The causal mask is spelled as transformers spells it (``finfo(bfloat16).min`` where a key is
not seen). FLOPs are 4·B·H·S_q·S_k·D, every key counted (a causal mask halves the work done).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is defined

from benchmarks.micro import harness as micro  # noqa: E402
from kopt.kernels import capped_attention  # noqa: E402
from kopt.kernels._autotune import config_name  # noqa: E402

# (model, B, H, H_kv, S, D, query_pre_attn_scalar, cap): Gemma-2-9B and Gemma-2-2B, 2048-token prefill
SHAPES = (("gemma2-9b", 1, 16, 8, 2048, 256, 256, 50.0), ("gemma2-2b", 1, 8, 4, 2048, 256, 256, 50.0))
TINY = (("tiny", 1, 4, 2, 80, 32, 32, 50.0),)


def spelled_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
                cap: float) -> torch.Tensor:
    """transformers' Gemma 2 eager attention: keys and values repeated, product, cap, mask, float32 softmax."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    s = torch.matmul(q, k.transpose(2, 3)) * scale
    s = torch.tanh(s / cap) * cap + mask
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v)


def measure_shape(model: str, b: int, h: int, h_kv: int, s: int, d: int, scalar: int, cap: float,
                  device: torch.device) -> list[dict[str, Any]]:
    g = torch.Generator(device=device).manual_seed(s)
    q = (torch.randn(b, s, h, d, device=device, generator=g) * 2).bfloat16().transpose(1, 2)  # logits of a few tens
    k, v = (torch.randn(b, s, h_kv, d, device=device, generator=g).bfloat16().transpose(1, 2) for _ in range(2))
    seen = torch.arange(s, device=device)[None, :] <= torch.arange(s, device=device)[:, None]
    # as transformers builds it: the dtype's lowest value where a key is not seen (not -inf)
    mask = torch.where(seen, 0.0, torch.finfo(torch.bfloat16).min).to(torch.bfloat16)[None, None]
    scale = scalar ** -0.5
    exact = capped_attention.reference(q.float(), k.float(), v.float(), mask.float(), scale, cap)
    flops = 4 * b * h * s * s * d
    label = dict(model=model, shape=f"B{b} H{h}/{h_kv} S{s} D{d} cap {cap:g}")
    rows = [micro.timed_row(label, "spelled out, eager", "transformers' eager path",
                            lambda: spelled_out(q, k, v, mask, scale, cap), exact, flops, device)]
    if device.type == "cuda":
        compiled = torch.compile(spelled_out, dynamic=False)
        rows.append(micro.timed_row(label, "spelled out, Inductor", "torch.compile (what a regional compile lowers)",
                                    lambda: compiled(q, k, v, mask, scale, cap), exact, flops, device))
        rows.append(micro.timed_row(label, "sdpa, no cap", "torch's choice, is_causal (not the same computation)",
                                    lambda: torch.nn.functional.scaled_dot_product_attention(
                                        q, k, v, is_causal=True, scale=scale, enable_gqa=True),
                                    None, flops, device))
    rows.append(micro.timed_row(label, "kopt fused", "autotuned",
                                lambda: capped_attention.launch(q, k, v, mask, scale, cap), exact, flops, device))
    configs = capped_attention.candidates(d, capped_attention.shared_limit(device))
    configs = configs if device.type == "cuda" else configs[:1]
    for config in configs:
        rows.append(micro.timed_row(label, "kopt fused", config_name(config),
                                    lambda config=config: capped_attention.launch(q, k, v, mask, scale, cap,
                                                                                  config=config),
                                    exact, flops, device))
    return rows


def main() -> None:
    device, out, tiny = micro.parse_args(__doc__.splitlines()[0])
    rows = [row for shape in (TINY if tiny else SHAPES) for row in measure_shape(*shape, device=device)]
    table = micro.kernel_table(rows)
    print(micro.write(out, "capped_attention", "Soft-capped attention (Gemma 2)",
                      "GPU time of one call (CUDA-graph replay, median); rel err against float32 attention; "
                      "TFLOP/s count every key (causal: half are masked).",
                      micro.KERNEL_HEADER, table, rows, device))


if __name__ == "__main__":
    main()
