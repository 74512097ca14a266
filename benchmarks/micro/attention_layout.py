#!/usr/bin/env python3
"""bf16 SDPA per backend and per input layout, at the zoo's attention shapes.

    python benchmarks/micro/attention_layout.py          # on the GPU: attention_layout.{json,md}
    python benchmarks/micro/attention_layout.py --tiny   # CPU smoke run (small shape; times mean nothing)

Why: on LTX-Video (s14b) the same cuDNN attention kernel takes 28.4 ms per forward in eager, 30.4 ms
under torch.compile and 31.0 ms under kopt. A DiT's Q/K/V come out of a projection as (B, S, H·D)
and are viewed as (B, H, S, D) (strides S·H·D, D, H·D, 1: "projection layout"); a fused producer
may instead write them (B, H, S, D)-contiguous ("head-major"); and a merged Q/K/V projection
(``sibling-merge``) leaves them as slices of one (B, S, 3·H·D) buffer, row stride 3·H·D
("merged-qkv"), or only V so when Q and K go through a fused QK-norm/RoPE kernel ("merged-v", kopt
on LTX-Video); "mixed" is Q, K head-major and V a projection's view. This times each backend the
device offers on every layout, so a layout that costs attention time shows up as a number.

Times are CUDA-graph replays (GPU time only, median) of one call. FLOPs are 4·B·H·S²·D.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from benchmarks.micro import harness as micro  # noqa: E402

# (model, B, H, S, D): LTX-Video (6,930 tokens at 704x480 and 161 frames, 32 heads of 64), FLUX.1
# joint attention (4096 image + 512 text tokens, 24 heads of 128), Wan 2.1 14B at 480p and 81 frames
# (32,760 tokens, 40 heads of 128)
SHAPES = (("ltx-video", 1, 32, 6930, 64), ("flux1", 1, 24, 4608, 128), ("wan-14b-480p", 1, 40, 32760, 128))
TINY = (("tiny", 1, 2, 96, 16),)
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def _projected(b: int, h: int, s: int, d: int, g: torch.Generator, device: torch.device,
               width: int = 1) -> list[torch.Tensor]:
    """``width`` (B, H, S, D) tensors viewed over one (B, S, width·H·D) buffer, as the outputs of one
    projection (width 1) or slices of a merged Q/K/V projection (width 3) are."""
    merged = torch.randn(b, s, width * h * d, device=device, generator=g).bfloat16()
    return [part.unflatten(2, (h, d)).transpose(1, 2) for part in merged.split(h * d, dim=2)]


def layouts(b: int, h: int, s: int, d: int, g: torch.Generator,
            device: torch.device) -> dict[str, tuple[torch.Tensor, ...]]:
    """The same Q, K, V values in each layout (module docstring)."""
    q, k, v = (_projected(b, h, s, d, g, device)[0] for _ in range(3))
    fused = _projected(b, h, s, d, g, device, width=3)
    for part, value in zip(fused, (q, k, v), strict=True):
        part.copy_(value)
    return {"projection": (q, k, v), "head-major": (q.contiguous(), k.contiguous(), v.contiguous()),
            "mixed": (q.contiguous(), k.contiguous(), v), "merged-qkv": tuple(fused), "merged-v": (q, k, fused[2])}


def measure_shape(model: str, b: int, h: int, s: int, d: int, device: torch.device,
                  backends: tuple[str, ...]) -> list[dict[str, Any]]:
    g = torch.Generator(device=device).manual_seed(s)
    inputs = layouts(b, h, s, d, g, device)
    q, k, v = inputs["projection"]
    exact = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    flops = 4 * b * h * s * s * d
    rows = []
    for backend in backends:
        for layout, (qq, kk, vv) in inputs.items():
            label = dict(model=model, shape=f"B{b} H{h} S{s} D{d}", backend=backend, layout=layout,
                         strides=[list(x.stride()) for x in (qq, kk, vv)])

            def call(qq=qq, kk=kk, vv=vv, backend=backend):
                with sdpa_kernel(BACKENDS[backend]):
                    return torch.nn.functional.scaled_dot_product_attention(qq, kk, vv)
            try:
                out = call()
                error = ((out.double() - exact.double()).norm() / exact.double().norm()).item()
                ms = micro.replay_ms(call, device)
                row = dict(label, ms=ms, tflops=flops / (ms * 1e-3) / 1e12, rel_err=error,
                           out_strides=str(tuple(out.stride())))
            except RuntimeError as err:  # a backend that does not take this shape or layout
                row = dict(label, ms=None, tflops=None, rel_err=None, error=(str(err).splitlines() or ["?"])[0][:160])
            print(row, flush=True)
            rows.append(row)
    return rows


def _strides(row: dict[str, Any]) -> str:
    return " ".join(str(tuple(x)) for x in row["strides"])


def main() -> None:
    device, out, tiny = micro.parse_args(__doc__.splitlines()[0])
    backends = ("cudnn", "flash", "efficient") if device.type == "cuda" else ("math",)
    rows = [r for shape in (TINY if tiny else SHAPES) for r in measure_shape(*shape, device=device, backends=backends)]
    table = [f"| {r['model']} | {r['shape']} | {r['backend']} | {r['layout']} {_strides(r)} | "
             f"{micro.cell(r['ms'], '.4f')} | {micro.cell(r['tflops'], '.0f')} | {micro.cell(r['rel_err'], '.2e')} |"
             + (f" failed: {r['error']}" if r.get("error") else "") for r in rows]
    print(micro.write(out, "attention_layout", "bf16 SDPA by backend and input layout",
                      "GPU time of one call (CUDA-graph replay, median); rel err against float32 SDPA. "
                      "Layouts as in the script's docstring; strides of Q, K, V.",
                      ["| model | shape | backend | layout (Q, K, V strides) | ms | TFLOP/s | rel err |",
                       "|---|---|---|---|---:|---:|---:|"], table, rows, device))


if __name__ == "__main__":
    main()
