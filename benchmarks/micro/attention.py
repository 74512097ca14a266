#!/usr/bin/env python3
"""Attention at the production shapes: kopt's FP8 kernel (every launch config) against torch's
bf16 SDPA (cuDNN / flash), in TFLOP/s, with each one's error against float32 attention.

    python benchmarks/micro/attention.py  # on the GPU: writes attention.{json,md} under $OUT or benchmarks/results
    python benchmarks/micro/attention.py --tiny     # CPU smoke run (interpreter, small shapes; times mean nothing)

Times are CUDA-graph replays (GPU time only, median) of one call; the FP8 kernel's time includes
its K/V quantization kernel. FLOPs are 4·B·H·S_q·S_k·D.
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
from kopt.kernels import fp8_attention  # noqa: E402

# (model, B, H, S, text keys, masked keys): FLUX.2 joint attention (4096 image + 512 text tokens, 48
# heads), Qwen-Image (256 text + 4096 image tokens, 24 heads, the last 64 text keys padded and masked,
# as a negative prompt's are; timed also with the window the pass proves, the text keys, and without
# a mask, to show what the mask costs)
SHAPES = (("flux2", 1, 48, 4608, 512, 0), ("qwen-image", 1, 24, 4352, 256, 64), ("qwen-nomask", 1, 24, 4352, 256, 0))
TINY = (("tiny", 1, 2, 100, 20, 10),)


def measure_shape(model: str, b: int, h: int, s: int, text: int, masked: int,
                  device: torch.device) -> list[dict[str, Any]]:
    """torch's bf16 SDPA, then the FP8 kernel under each launch config, on one shape; with a mask,
    each config also with the mask's window (the text keys, as :mod:`kopt.fx.match.key_mask_window`
    proves it for Qwen-Image)."""
    head_dim = 128 if device.type == "cuda" else 32
    g = torch.Generator(device=device).manual_seed(s)
    q, k, v = (torch.randn(b, s, h, head_dim, device=device, generator=g).bfloat16().transpose(1, 2)
               for _ in range(3))
    key_bias = None
    if masked:
        key_bias = torch.zeros(b, s, device=device, dtype=torch.bfloat16)
        key_bias[:, text - masked:text] = float("-inf")
    mask = None if key_bias is None else key_bias[:, None, None, :]
    exact = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=None if mask is None else mask.float())
    flops = 4 * b * h * s * s * head_dim
    label = dict(model=model, shape=f"B{b} H{h} S{s} D{head_dim}")
    rows = [micro.timed_row(label, "sdpa bf16", "torch's choice (cuDNN / flash)",
                            lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                            exact, flops, device)]
    configs = fp8_attention.candidates() if device.type == "cuda" else fp8_attention.candidates()[:1]
    windows = [None, (0, text)] if key_bias is not None else [None]
    for config, window in ((c, w) for c in configs for w in windows):
        name = ",".join(f"{key}={value}" for key, value in config.items())
        name += f",window={window[0]}:{window[1]}" if window else ""
        rows.append(micro.timed_row(label, "kopt fp8", name,
                                    lambda config=config, window=window: fp8_attention.launch(
                                        q, k, v, key_bias, config=config, bias_window=window),
                                    exact, flops, device))
    return rows


def run(shapes: tuple[tuple[str, int, int, int, int], ...], device: torch.device) -> list[dict[str, Any]]:
    return [row for shape in shapes for row in measure_shape(*shape, device=device)]


def main() -> None:
    device, out, tiny = micro.parse_args(__doc__.splitlines()[0])
    rows = run(TINY if tiny else SHAPES, device)
    table = micro.kernel_table(rows)
    print(micro.write(out, "attention", "Attention",
                      "GPU time of one call (CUDA-graph replay, median); rel err against float32 SDPA.",
                      micro.KERNEL_HEADER, table, rows, device))


if __name__ == "__main__":
    main()
