#!/usr/bin/env python3
"""FP8 GEMMs at the production shapes, one row per scale granularity, against bf16.

    python benchmarks/micro/fp8_gemm.py  # on the GPU: writes fp8-gemm.{json,md} under $OUT or benchmarks/results
    python benchmarks/micro/fp8_gemm.py --tiny     # CPU smoke run (small shapes; times mean nothing)

For each (M, K, N) linear of Qwen-Image and FLUX.2 and each granularity of
:class:`kopt.fp8.Granularity`: the GEMM exactly as kopt's ``fp8-linear`` pass emits it (weights
quantized once beforehand, the activation quantized once outside the timed region), timed by
CUDA-graph replay (GPU time only, median), its TFLOP/s, and the relative error of its output against
the float64 product of the bf16 operands (fresh random inputs with uneven row magnitudes). The
``quantize ms`` column is the activation's quantization compiled by Inductor, the per-call cost the
granularity adds before its GEMM. For the block granularities the row also says which scale memory
order the GPU's block-scaled GEMM took (:func:`kopt.passes.fp8.block_mm.cuda_scale_layout`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.micro import harness as micro  # noqa: E402
from kopt.fp8.config import Granularity  # noqa: E402
from kopt.fp8.quantize import Operand, block_shape, quantize  # noqa: E402
from kopt.passes.fp8 import block_mm  # noqa: E402

# (model, layer, M tokens, K in, N out): the large linears of one block at 4096 image tokens
SHAPES = (
    ("qwen-image", "to_qkv (merged)", 4096, 3072, 9216),
    ("qwen-image", "attn out", 4096, 3072, 3072),
    ("qwen-image", "mlp up", 4096, 3072, 12288),
    ("qwen-image", "mlp down", 4096, 12288, 3072),
    ("flux2", "single: qkv + mlp up", 4608, 6144, 55296),
    ("flux2", "single: out", 4608, 24576, 6144),
    ("flux2", "double: mlp down", 4096, 18432, 6144),
)
TINY = (("tiny", "linear", 64, 256, 384),)


def gemm_for(granularity: Granularity | None, x: torch.Tensor, w: torch.Tensor
             ) -> tuple[Callable[[], torch.Tensor], Callable[[], Any], str]:
    """(the GEMM on pre-quantized operands, the activation's quantization, a note)."""
    if granularity is None:
        return (lambda: x @ w.t()), (lambda: None), "bf16 cuBLAS"
    qw, sw = quantize(w, granularity, Operand.WEIGHT)
    qx, sx = quantize(x, granularity)
    quantize_x = torch.compile(lambda: quantize(x, granularity)) if x.is_cuda else (lambda: quantize(x, granularity))
    block = block_shape(granularity, Operand.WEIGHT)
    if block is None:
        sw = sw.t().contiguous() if granularity is Granularity.ROW else sw
        return (lambda: torch._scaled_mm(qx, qw.t(), sx, sw, out_dtype=x.dtype)), quantize_x, "torch._scaled_mm"
    rows = block[0]
    note = "reference (no GPU)"
    if x.is_cuda:
        layout = block_mm.cuda_scale_layout(x.device.index or 0, rows)
        note = layout.describe() if isinstance(layout, block_mm.ScaleLayout) else f"fallback: {layout}"
    sw = block_mm.pack_weight_scale(sw, rows)
    return (lambda: torch.ops.kopt.fp8_block_mm(qx, sx, qw, sw, None, x.dtype, rows)), quantize_x, note


def run(shapes: tuple[tuple[str, str, int, int, int], ...], device: torch.device) -> list[dict[str, Any]]:
    rows = []
    for model, layer, m, k, n in shapes:
        generator = torch.Generator(device=device).manual_seed(m + k + n)
        x = (torch.randn(m, k, device=device, generator=generator)
             * torch.rand(m, 1, device=device, generator=generator) * 4).to(torch.bfloat16)
        w = (torch.randn(n, k, device=device, generator=generator) / k**0.5).to(torch.bfloat16)
        exact = x.double() @ w.double().t()
        for granularity in (None, *Granularity):
            name = "bf16" if granularity is None else granularity.value
            try:
                gemm, quantize_x, note = gemm_for(granularity, x, w)
                out = gemm()
                error = ((out.double() - exact).norm() / exact.norm()).item()
                ms = micro.replay_ms(gemm, device)
                quantize_x()
                quant_ms = None if granularity is None else micro.replay_ms(quantize_x, device)
            except Exception as failure:  # noqa: BLE001 - a granularity this build cannot run is a row saying so
                rows.append(dict(model=model, layer=layer, m=m, k=k, n=n, granularity=name,
                                 error=f"{type(failure).__name__}: {str(failure).splitlines()[0][:200]}"))
                print(f"{model:<10} {layer:<22} {name:<14} FAILED {rows[-1]['error']}", flush=True)
                continue
            tflops = 2 * m * k * n / (ms * 1e-3) / 1e12
            rows.append(dict(model=model, layer=layer, m=m, k=k, n=n, granularity=name, ms=ms, tflops=tflops,
                             quantize_ms=quant_ms, rel_err=error, note=note))
            print(f"{model:<10} {layer:<22} {name:<14} {ms:8.4f} ms {tflops:7.1f} TFLOP/s rel {error:.2e} "
                  f"quant {quant_ms or 0:.4f} ms  {note}", flush=True)
    return rows


def write(rows: list[dict[str, Any]], out_dir: Path, device: torch.device) -> str:
    table = []
    for r in rows:
        shape = f"{r['m']}×{r['k']}×{r['n']}"
        if "error" in r:
            table.append(f"| {r['model']} | {r['layer']} | {shape} | {r['granularity']} | – | – | – | – "
                         f"| {r['error']} |")
            continue
        quant = "–" if r["quantize_ms"] is None else f"{r['quantize_ms']:.4f}"
        table.append(f"| {r['model']} | {r['layer']} | {shape} | {r['granularity']} | {r['ms']:.4f} | "
                     f"{r['tflops']:.0f} | {quant} | {r['rel_err']:.2e} | {r['note']} |")
    return micro.write(out_dir, "fp8-gemm", "FP8 GEMM by granularity",
                       "GPU time from CUDA-graph replay (median); rel err against the float64 product of the bf16 "
                       "operands; `quantize ms`: the activation's quantization (Inductor), paid per call before "
                       "the GEMM.",
                       ["| model | layer | M×K×N | granularity | GEMM ms | TFLOP/s | quantize ms | rel err | note |",
                        "|---|---|---|---|---:|---:|---:|---:|---|"], table, rows, device)


def main() -> None:
    device, out, tiny = micro.parse_args(__doc__.splitlines()[0])
    print(write(run(TINY if tiny else SHAPES, device), out, device))


if __name__ == "__main__":
    main()
