#!/usr/bin/env python3
"""SASS instruction counts of kopt's activation + FP8 quantize kernel, compiled for sm_90 on this
machine (no GPU needed: Triton's bundled ptxas and cuobjdump do the work).

    python benchmarks/sass.py          # per-value counts, with and without kernels/_fastmath.py's PTX forms

Why: the kernel is bound by instruction issue rather than memory bandwidth on the H200, so the
number of instructions each value costs is what its speed follows (``kernels/activation_quant.py``).
The counts are per value of the row: whole-kernel SASS instructions (one program, one row) divided
by the 12288 columns one program's threads share, so a layout's idle lanes count against it. Each
layout runs with the num_warps the autotuner chose for it on the H200.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from kopt.kernels import activation_quant  # noqa: E402

_SIGNATURE = {"prefix_ptr": "*bf16", "h_ptr": "*bf16", "q_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "P": "i32",
              "F": "i32", "stride_p": "i32", "stride_h": "i32", "stride_q": "i32"}


def sass_counts(kernel: triton.JITFunction, constants: dict[str, object], num_warps: int) -> collections.Counter:
    """Opcode counts of ``kernel`` compiled for sm_90 with ``constants`` (its constexprs), every
    integer argument divisible by 16 as Triton specializes the production shapes."""
    signature = dict(_SIGNATURE, **{name: "constexpr" for name in constants})
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(_SIGNATURE))}
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 128),
                              options={"num_warps": num_warps, "launch_pdl": True})
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as folder:
        cubin = os.path.join(folder, "kernel.cubin")
        Path(cubin).write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([str(tools / "cuobjdump"), "-sass", cubin], capture_output=True, text=True,
                              check=True).stdout
    opcodes = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)", sass)
    return collections.Counter(op.split(".")[0] for op in opcodes)


def rows() -> list[tuple[str, str, int, int]]:
    """(layout, math, instructions, instructions per value) for Qwen-Image's GELU quantize (12288 columns)."""
    out = []
    columns = 12288
    layouts = (("one 16384-wide block, 32 warps", activation_quant._activation_quant_kernel,
                {"HAS_PREFIX": False, "IS_SWIGLU": False, "BLOCK": 16384, "P_CHUNKS": 0, "F_CHUNKS": 1,
                 "ONE_PASS": True, "PREFIX_BLOCK": 1}, 32),
               ("3 register chunks of 4096, 16 warps", activation_quant._activation_quant_chunks_kernel,
                {"HAS_PREFIX": False, "IS_SWIGLU": False, "BLOCK": 4096, "PREFIX_BLOCK": 1, "CHUNKS": 3,
                 "P_CHUNKS": 0}, 16))
    for layout, kernel, constants, warps in layouts:
        per_thread = columns / (32 * warps)
        for fast in (False, True):
            counts = sass_counts(kernel, {**constants, "FAST": fast, "PDL": True}, warps)
            total = sum(counts.values())
            out.append((layout, "PTX forms" if fast else "plain Triton", total, total / per_thread))
    return out


def main() -> None:
    print("| layout | math | SASS instructions | per value |\n|---|---|---:|---:|")
    for layout, math, total, per_value in rows():
        print(f"| {layout} | {math} | {total} | {per_value:.1f} |")


if __name__ == "__main__":
    main()
