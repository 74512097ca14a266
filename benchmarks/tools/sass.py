#!/usr/bin/env python3
"""SASS instruction counts of kopt's activation + FP8 quantize kernel, compiled for sm_90 on this
machine (no GPU needed: Triton's bundled ptxas and cuobjdump do the work).

    python benchmarks/tools/sass.py          # per-value counts, with and without kopt/kernels/_fastmath.py's PTX forms,
                                       # then registers / global loads of the layouts the docstrings cite
    python benchmarks/tools/sass.py attention [HEAD_DIM ...]   # registers and spills of capped_attention's tiles

Why: the kernel is bound by instruction issue rather than memory bandwidth on the H200, so the
number of instructions each value costs is what its speed follows (``kopt/kernels/activation_quant.py``).
The counts are per value of the row: whole-kernel SASS instructions (one program, one row) divided
by the 12288 columns one program's threads share, so a layout's idle lanes count against it. Each
layout runs with the num_warps the autotuner chose for it on the H200.
"""

from __future__ import annotations

import collections
import inspect
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from kopt.kernels import activation_quant, capped_attention, qk_norm_rope  # noqa: E402

_SIGNATURE = {"prefix_ptr": "*bf16", "h_ptr": "*bf16", "q_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "P": "i32",
              "F": "i32", "stride_p": "i32", "stride_h": "i32", "stride_q": "i32"}


_QK_SIGNATURE = {"x_ptr": "*bf16", "w_ptr": "*bf16", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "out_ptr": "*bf16",
                 "x2_ptr": "*bf16", "w2_ptr": "*bf16", "out2_ptr": "*bf16",
                 **{name: "i32" for name in ("n_rows", "S", "H", "stride_xb", "stride_xs", "stride_xh", "stride_x2b",
                                             "stride_x2s", "stride_x2h", "stride_cs", "stride_cd", "stride_ss",
                                             "stride_sd", "half")}, "eps": "fp32", "eps2": "fp32"}


def compile_sm90(kernel: triton.JITFunction, constants: dict[str, object], num_warps: int,
                 signature: dict[str, str] = _SIGNATURE, num_stages: int = 3) -> tuple[collections.Counter, int]:
    """(opcode counts, registers per thread) of ``kernel`` compiled for sm_90 with ``constants`` (its
    constexprs, and the arguments Triton specializes to 1 such as a unit stride), every other pointer
    and integer argument divisible by 16 as Triton specializes the production shapes."""
    full = {name: "constexpr" if name in constants else kind for name, kind in signature.items()}
    full.update({name: "constexpr" for name in constants})
    attrs = {(i,): [["tt.divisibility", 16]] for i, kind in enumerate(full.values())
             if kind not in ("fp32", "constexpr")}
    source = triton.compiler.ASTSource(fn=kernel, signature=full, constexprs=constants, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 128),
                              options={"num_warps": num_warps, "num_stages": num_stages, "launch_pdl": True})
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as folder:
        cubin = os.path.join(folder, "kernel.cubin")
        Path(cubin).write_bytes(compiled.asm["cubin"])
        sass, usage = (subprocess.run([str(tools / "cuobjdump"), flag, cubin], capture_output=True, text=True,
                                      check=True).stdout for flag in ("-sass", "-res-usage"))
    opcodes = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)", sass)
    return collections.Counter(op.split(".")[0] for op in opcodes), int(re.search(r"REG:(\d+)", usage).group(1))


def _attention_signature() -> dict[str, str]:
    """capped_attention's kernel arguments: bf16 tensors, int32 sizes and strides, float32 scales."""
    names = inspect.signature(capped_attention._capped_attention_kernel.fn).parameters
    kinds = {"span_ptr": "*i32", "pre": "fp32", "post": "fp32"}
    return {name: kinds.get(name, "*bf16" if name.endswith("_ptr") else "i32") for name in names
            if names[name].annotation is inspect.Parameter.empty}


def attention_rows(head_dims: tuple[int, ...] = (128, 256)) -> list[tuple[int, str, int, int, int]]:
    """(head dim, tile, registers per thread, local loads, local stores) of capped_attention's kernel with a
    soft-cap and a mask, for every tile of (BLOCK_M, BLOCK_N, num_warps) it knows at 2 pipeline stages
    and the head dims of Llama / Gemma 2; local memory traffic is spilled registers. Its candidates keep the
    tiles that do not spill (or barely)."""
    out = []
    unit = {name: 1 for name in ("stride_qd", "stride_kd", "stride_vd", "stride_od", "stride_bn")}
    for head_dim in head_dims:
        for block_m, block_n, warps in capped_attention._TILES:
            constants = dict(unit, HAS_BIAS=True, SOFTCAP=True, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=head_dim,
                             PRECISION=None, UPCAST=False, EVEN_D=True, FAST=True)
            counts, registers = compile_sm90(capped_attention._capped_attention_kernel, constants, warps,
                                             _attention_signature(), num_stages=2)
            out.append((head_dim, f"{block_m} x {block_n}, {warps} warps", registers, counts["LDL"], counts["STL"]))
    return out


def sass_counts(kernel: triton.JITFunction, constants: dict[str, object], num_warps: int) -> collections.Counter:
    """Opcode counts of ``kernel`` (an activation + quantize kernel) compiled for sm_90."""
    return compile_sm90(kernel, constants, num_warps)[0]


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


def resource_rows() -> list[tuple[str, int, int, int, int]]:
    """(kernel and layout, warps, registers per thread, programs per SM by registers, global loads)
    for the layouts whose registers or loads the kernel docstrings cite: FLUX.2's single-stream
    activation + quantize in register chunks (prefix read in pieces), and qk_norm_rope's 8-row
    programs with the RoPE table row loaded per head or once per token (``ONE_TOKEN``), and for Q and
    K together (``PAIR``)."""
    out = []
    chunks = {"HAS_PREFIX": True, "IS_SWIGLU": True, "BLOCK": 4096, "PREFIX_BLOCK": 8192, "CHUNKS": 5, "P_CHUNKS": 2,
              "FAST": True, "PDL": True}
    cases = [("activation_quant, 5 register chunks of 4096 + 6144 prefix",
              activation_quant._activation_quant_chunks_kernel, chunks, 16, _SIGNATURE)]
    for mode, one_token, pair in (("real", False, False), ("real", True, False), ("complex", False, False),
                                  ("complex", True, False), ("real", False, True)):
        constants = {"IS_COMPLEX": mode == "complex", "HAS_WEIGHT": True, "HAS_WEIGHT2": pair, "PAIR": pair,
                     "ROWS_PER_PROGRAM": 8, "BLOCK_HALF": 64, "ONE_TOKEN": one_token, "PDL": True}
        label = (f"qk_norm_rope{' pair (Q and K)' if pair else ''} {mode}, 8 rows, table "
                 f"{'once per token' if one_token else 'per head'}")
        cases.append((label, qk_norm_rope._qk_norm_rope_kernel, constants, 2, _QK_SIGNATURE))
    for label, kernel, constants, warps, signature in cases:
        counts, registers = compile_sm90(kernel, constants, warps, signature)
        threads = 32 * warps
        per_sm = 65536 // (((registers + 7) // 8 * 8) * threads)  # registers are allocated in groups of 8
        out.append((label, warps, registers, per_sm, counts["LDG"]))
    return out


def main() -> None:
    if sys.argv[1:2] == ["attention"]:
        print("| head dim | tile | registers / thread | local loads | local stores |\n|---:|---|---:|---:|---:|")
        for row in attention_rows(tuple(int(d) for d in sys.argv[2:]) or (128, 256)):
            print("| " + " | ".join(str(x) for x in row) + " |")
        return
    print("| layout | math | SASS instructions | per value |\n|---|---|---:|---:|")
    for layout, math, total, per_value in rows():
        print(f"| {layout} | {math} | {total} | {per_value:.1f} |")
    print("\n| kernel, layout | warps | registers / thread | programs / SM (registers) | global loads |\n"
          "|---|---:|---:|---:|---:|")
    for label, warps, registers, per_sm, loads in resource_rows():
        print(f"| {label} | {warps} | {registers} | {per_sm} | {loads} |")


if __name__ == "__main__":
    main()
