#!/usr/bin/env python3
"""A DiT feed-forward's up-projection and tanh GELU, in the three forms kopt can leave it in, each
lowered by Inductor: the bias in the GEMM (``addmm``, what ``torch.compile`` runs), the bias moved
into the GELU's kernel (``bias-absorption``), and GELU in cuBLASLt's epilogue (``fuse-linear-gelu``).

    python benchmarks/micro/linear_epilogue.py         # on the GPU: linear_epilogue.{json,md} under $OUT
    python benchmarks/micro/linear_epilogue.py --tiny  # CPU smoke run (small shape; times mean nothing)

Times are CUDA-graph replays (GPU time only, median) of the whole form: GEMM and elementwise
kernels together, as a forward runs them. Each row also names the kernels Inductor generated, and
the Triton source of the absorbed form is written next to the results (``linear_epilogue_*.py``), so a
slow elementwise kernel can be read, not guessed at. Error is against the float32 computation.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.micro import harness as micro  # noqa: E402
from kopt.kernels import linear_gelu  # noqa: E402,F401  (torch.ops.kopt.linear_gelu_tanh)

# (model, rows M, in K, out N): the feed-forward up-projections of LTX-Video (2 x 6,930 tokens, CFG
# batched), FLUX.1 and Qwen-Image (image tokens of one 1024^2 image)
SHAPES = (("ltx-video", 13860, 2048, 8192), ("flux1", 4096, 3072, 12288), ("qwen-image", 4096, 3072, 12288))
TINY = (("tiny", 37, 16, 48),)


def bias_in_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


def bias_absorbed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.gelu(torch.mm(x, weight.t()) + bias, approximate="tanh")


def gelu_epilogue(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.ops.kopt.linear_gelu_tanh(x, weight.t(), bias)


FORMS = (("bias in GEMM", bias_in_gemm), ("bias absorbed", bias_absorbed), ("GELU epilogue", gelu_epilogue))


def _kernel_names(sources: list[str]) -> list[str]:
    """The generated kernels (Triton or C++) and extern GEMM calls named in Inductor's output code."""
    names = []
    for source in sources:
        names += re.findall(r"^(\w+) = async_compile\.", source, flags=re.M)
        names += re.findall(r"(extern_kernels\.\w+)\(", source)
    return names


def measure_shape(model: str, m: int, k: int, n: int, device: torch.device, out: Path) -> list[dict[str, Any]]:
    from torch._inductor.utils import run_and_get_code

    g = torch.Generator(device=device).manual_seed(m + k + n)
    x = torch.randn(m, k, device=device, generator=g).bfloat16()
    weight = (torch.randn(n, k, device=device, generator=g) / k**0.5).bfloat16()
    bias = torch.randn(n, device=device, generator=g).bfloat16()
    exact = F.gelu(x.float() @ weight.float().t() + bias.float(), approximate="tanh")
    rows = []
    for form, fn in FORMS:
        for lowering in ("eager", "inductor"):
            call = fn if lowering == "eager" else torch.compile(fn, fullgraph=True, dynamic=False)
            kernels: list[str] = []
            if lowering == "inductor":
                result, sources = run_and_get_code(call, x, weight, bias)
                kernels = _kernel_names(sources)
                if form == "bias absorbed":
                    (out / f"linear_epilogue_{model}.py").write_text("\n\n".join(sources))
            else:
                result = call(x, weight, bias)
            error = ((result.double() - exact.double()).norm() / exact.double().norm()).item()
            ms = micro.replay_ms(lambda call=call: call(x, weight, bias), device)
            row = dict(model=model, shape=f"M{m} K{k} N{n}", form=form, lowering=lowering, ms=ms,
                       rel_err=error, kernels=kernels)
            print(f"{model:<11} {form:<14} {lowering:<9} {ms:8.4f} ms rel {error:.2e} {' '.join(kernels)}",
                  flush=True)
            rows.append(row)
    return rows


def main() -> None:
    device, out, tiny = micro.parse_args(__doc__.splitlines()[0])
    out.mkdir(parents=True, exist_ok=True)
    rows = [row for shape in (TINY if tiny else SHAPES) for row in measure_shape(*shape, device=device, out=out)]
    table = [f"| {r['model']} | {r['shape']} | {r['form']} | {r['lowering']} | {r['ms']:.4f} | {r['rel_err']:.2e} "
             f"| {', '.join(r['kernels'])} |" for r in rows]
    print(micro.write(out, "linear_epilogue", "Feed-forward up-projection + tanh GELU, three forms",
                      "GPU time of the whole form (CUDA-graph replay, median); rel err against float32.",
                      ["| model | shape | form | lowering | ms | rel err | kernels |",
                       "|---|---|---|---|---:|---:|---|"],
                      table, rows, device))


if __name__ == "__main__":
    main()
