#!/usr/bin/env python3
"""Kernel library at the production shapes: achieved bandwidth against the copy ceiling.

    python benchmarks/micro/kernels.py                 # on the GPU: production shapes, writes JSON + markdown
    python benchmarks/micro/kernels.py --size tiny     # CPU smoke run under TRITON_INTERPRET=1 (times mean nothing)

For each kernel: the bytes it must move (from its docstring's formula), the median time of the
Triton launcher (CUDA events through ``triton.testing.do_bench``; fresh random inputs, never
zeros), the same for the eager reference and for ``torch.compile`` of the reference (what Inductor
would generate for that region), the relative error of the kernel against the reference, and the
achieved bandwidth bytes / time as a fraction of a device-to-device copy measured in the same run.

The first launch of each kernel autotunes its launch config (``kopt.kernels._autotune``; on the
GPU only, ``KOPT_AUTOTUNE=0`` keeps the heuristic default): the table reports the chosen config,
whether it was tuned now or read from the cache, and the tuner's time for the heuristic default;
the JSON has every candidate's time and the tuner's cache file is copied next to it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is defined

from kopt.kernels import (  # noqa: E402
    _autotune,
    activation_quant,
    adaln_modulation,
    adaln_modulation_quant,
    gated_residual,
    gated_residual_quant,
    gelu_tanh,
    joint_qk_norm_rope,
    qk_norm_rope,
    qk_norm_rope_pair,
    swiglu,
)


@dataclasses.dataclass
class Case:
    """One kernel at one shape: inputs, bytes to move, launcher and reference."""

    name: str
    shape: str
    inputs: Callable[[], tuple[Any, ...]]
    nbytes: Callable[[tuple[Any, ...]], int]
    kernel: Callable[..., Any]
    reference: Callable[..., Any]
    tuned_as: str | None = None  # the autotuned kernel it launches, when its name differs (the joint op)


def _bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def cases(size: str, device: torch.device) -> list[Case]:
    """Qwen-Image / FLUX.2 production shapes (bf16) or tiny ones for the CPU smoke run."""
    full = size == "full"
    dtype = torch.bfloat16
    tokens, width = (4096, 3072) if full else (7, 40)
    heads, head_dim, seq = (24, 128, 4352) if full else (2, 16, 9)
    hidden = 12288 if full else 24
    ff = 18432 if full else 33

    def randn(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dt)

    def adaln_inputs() -> tuple[Any, ...]:
        return randn(1, tokens, width), randn(1, width), randn(1, width)

    def gated_inputs() -> tuple[Any, ...]:
        return randn(1, tokens, width), randn(1, tokens, width), randn(1, width), randn(1, width), randn(1, width)

    def rope_inputs() -> tuple[Any, ...]:
        angles = torch.rand(seq, head_dim // 2, device=device) * 6.28
        return randn(1, seq, heads, head_dim), randn(head_dim), angles.cos(), angles.sin(), 1e-6, "complex"

    def rope_real_inputs() -> tuple[Any, ...]:  # FLUX.2 single-stream Q: 48 heads, 4096 + 512 tokens, (S, D) tables
        s = tokens + (512 if full else 3)
        angles = torch.rand(s, head_dim, device=device) * 6.28
        return randn(1, s, 2 * heads, head_dim), randn(head_dim), angles.cos(), angles.sin(), 1e-6, "real"

    def joint_inputs() -> tuple[Any, ...]:  # Qwen-Image joint Q: text and image streams into one buffer
        lengths = (256, tokens) if full else (3, tokens)
        xs = [randn(1, s, heads, head_dim) for s in lengths]
        angles = [torch.rand(s, head_dim // 2, device=device) * 6.28 for s in lengths]
        return (xs, [randn(head_dim), randn(head_dim)], [a.cos() for a in angles], [a.sin() for a in angles],
                [1e-6, 1e-6], "complex")

    ltx_tokens, ltx_width = (6930, 2048) if full else (5, 32)

    def rope_flat_inputs() -> tuple[Any, ...]:  # LTX-Video Q: heads flattened, one (S, H*D) float32 table
        angles = torch.rand(ltx_tokens, ltx_width, device=device) * 6.28
        return randn(1, ltx_tokens, 1, ltx_width), randn(ltx_width), angles.cos(), angles.sin(), 1e-6, "real"

    def rope_pair_inputs() -> tuple[Any, ...]:  # LTX-Video Q and K, the same tables
        q, wq, cos, sin, eps, mode = rope_flat_inputs()
        return q, wq, eps, randn(1, ltx_tokens, 1, ltx_width), randn(ltx_width), eps, cos, sin, mode

    flux_tokens, flux_ff = (4608, 9216) if full else (5, 12)

    def swiglu_quant_inputs() -> tuple[Any, ...]:  # h = the (M, 2F) up projection, F = 18432 at full size
        return randn(flux_tokens, 4 * flux_ff), randn(flux_tokens, 2 * width), "swiglu"

    def _joint_bytes(args: tuple[Any, ...]) -> int:
        xs, weights, cos, sin = args[:4]
        return 2 * _bytes(*xs) + _bytes(*weights, *cos, *sin)

    def _out(args: tuple[Any, ...], out: Any) -> int:
        """Every tensor argument read once plus every output written once."""
        outputs = out if isinstance(out, tuple) else (out,)
        return _bytes(*[a for a in args if isinstance(a, torch.Tensor)]) + _bytes(*outputs)

    return [
        Case("adaln_modulation", f"x (1, {tokens}, {width})", adaln_inputs,
             lambda a: _out(a, adaln_modulation.reference(*a)), adaln_modulation.launch, adaln_modulation.reference),
        Case("adaln_modulation_quant", f"x (1, {tokens}, {width}) -> fp8", adaln_inputs,
             lambda a: _out(a, adaln_modulation_quant.reference(*a)), adaln_modulation_quant.launch,
             adaln_modulation_quant.reference),
        Case("gated_residual", f"r, y (1, {tokens}, {width})", gated_inputs,
             lambda a: _out(a, gated_residual.reference(*a)), gated_residual.launch, gated_residual.reference),
        Case("gated_residual_quant", f"r, y (1, {tokens}, {width}) -> r_new, fp8", gated_inputs,
             lambda a: _out(a, gated_residual_quant.reference(*a)), gated_residual_quant.launch,
             gated_residual_quant.reference),
        Case("qk_norm_rope", f"q (1, {seq}, {heads}, {head_dim}) complex RoPE", rope_inputs,
             lambda a: _out(a, a[0]), qk_norm_rope.launch, qk_norm_rope.reference),
        Case("qk_norm_rope", f"q (1, {tokens + (512 if full else 3)}, {2 * heads}, {head_dim}) real RoPE",
             rope_real_inputs, lambda a: _out(a, a[0]), qk_norm_rope.launch, qk_norm_rope.reference),
        Case("qk_norm_rope", f"q (1, {ltx_tokens}, 1, {ltx_width}) real RoPE, heads flattened", rope_flat_inputs,
             lambda a: _out(a, a[0]), qk_norm_rope.launch, qk_norm_rope.reference),
        Case("qk_norm_rope_pair", f"q and k (1, {ltx_tokens}, 1, {ltx_width}) real RoPE, one table read",
             rope_pair_inputs, lambda a: _out(a, (a[0], a[3])), qk_norm_rope.launch_pair, qk_norm_rope_pair.reference,
             tuned_as="qk_norm_rope"),
        Case("qk_norm_rope_joint", f"q text (1, {256 if full else 3}, {heads}, {head_dim}) + image "
             f"(1, {tokens}, {heads}, {head_dim}) complex RoPE into one buffer", joint_inputs, _joint_bytes,
             joint_qk_norm_rope.launch, joint_qk_norm_rope.reference, tuned_as="qk_norm_rope"),
        Case("gelu_tanh", f"x (1, {tokens}, {hidden})", lambda: (randn(1, tokens, hidden),),
             lambda a: 2 * _bytes(a[0]), gelu_tanh.launch, gelu_tanh.reference),
        Case("activation_quant", f"swiglu, FLUX.2 single-stream: prefix ({flux_tokens}, {2 * width}) + "
             f"h ({flux_tokens}, {4 * flux_ff}) -> fp8", swiglu_quant_inputs,
             lambda a: _out(a, activation_quant.reference(*a)), activation_quant.launch, activation_quant.reference),
        Case("activation_quant", f"gelu_tanh, Qwen-Image feed-forward: h (1, {tokens}, {hidden}) -> fp8",
             lambda: (randn(1, tokens, hidden), None, "gelu_tanh"),
             lambda a: _out(a, activation_quant.reference(*a)), activation_quant.launch, activation_quant.reference),
        Case("swiglu", f"h (1, {tokens}, {2 * ff})", lambda: (randn(1, tokens, 2 * ff),),
             lambda a: _bytes(a[0]) * 3 // 2, swiglu.launch, swiglu.reference),
    ]


def median_ms(fn: Callable[[], Any], device: torch.device) -> float:
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def graph_ms(fn: Callable[[], Any], device: torch.device) -> float | None:
    """GPU time of ``fn`` replayed from a CUDA graph (median): the kernels alone, without the host's
    launch overhead that ``median_ms`` includes for kernels shorter than their Python launcher."""
    if device.type != "cuda":
        return None
    import triton.testing

    try:
        return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))
    except Exception as error:  # noqa: BLE001 - a launcher that cannot be captured still gets its wall time
        print(f"  (CUDA graph timing failed: {type(error).__name__}: {str(error)[:120]})", flush=True)
        return None


def copy_tbs(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    source = torch.randn(1 << 30, device=device, dtype=torch.bfloat16)
    target = torch.empty_like(source)
    ms = median_ms(lambda: target.copy_(source), device)
    return 2 * source.numel() * source.element_size() / (ms * 1e-3) / 1e12


def _dequantized(value: Any) -> Any:
    """(…, fp8 values, scales) → (…, their float32 product); anything else unchanged."""
    if isinstance(value, tuple) and len(value) >= 2 and value[-2].dtype == torch.float8_e4m3fn:
        deq = value[-2].float() * value[-1]
        return deq if len(value) == 2 else (*value[:-2], deq)
    return value


def rel_err(candidate: Any, reference: Any) -> float:
    candidate, reference = _dequantized(candidate), _dequantized(reference)
    pairs = zip(candidate, reference, strict=True) if isinstance(reference, tuple) else [(candidate, reference)]
    worst = 0.0
    for c, r in pairs:
        r64 = r.double()
        worst = max(worst, ((c.double() - r64).norm() / r64.norm()).item())
    return worst


def measure(case: Case, device: torch.device, ceiling: float | None) -> dict[str, Any]:
    """Time the kernel, the eager reference and (GPU) the compiled reference on one input set."""
    args = case.inputs()
    nbytes = case.nbytes(args)
    error = rel_err(case.kernel(*args), case.reference(*args))  # the first launch tunes
    choice = _autotune.TUNER.last.get(case.tuned_as or case.name)
    launch_ms = median_ms(lambda: case.kernel(*args), device)
    kernel_ms = graph_ms(lambda: case.kernel(*args), device) or launch_ms
    eager_ms = graph_ms(lambda: case.reference(*args), device) or median_ms(lambda: case.reference(*args), device)
    compiled_ms = None
    if device.type == "cuda":
        compiled = torch.compile(case.reference)
        compiled(*args)
        compiled_ms = graph_ms(lambda: compiled(*args), device) or median_ms(lambda: compiled(*args), device)
    achieved = nbytes / (kernel_ms * 1e-3) / 1e12
    return dict(kernel=case.name, shape=case.shape, bytes=nbytes, kernel_ms=kernel_ms, launch_ms=launch_ms,
                eager_ms=eager_ms,
                compiled_ms=compiled_ms, rel_err=error, achieved_tbs=achieved,
                fraction_of_copy=None if ceiling is None else achieved / ceiling,
                config=None if choice is None else choice.config,
                config_source=None if choice is None else choice.source,
                default_config=None if choice is None else choice.default,
                default_ms=None if choice is None else choice.timings_ms.get(choice.default),
                candidates_ms=None if choice is None else choice.timings_ms)


def _config_text(row: dict[str, Any]) -> str:
    """``ROWS_PER_PROGRAM=2,BLOCK_N=4096,num_warps=8 (tuned)``; ``–`` when the launcher did not report."""
    if row["config"] is None:
        return "–"
    return f"{_autotune.config_name(row['config'])} ({row['config_source']})"


def run(size: str, out_dir: Path) -> list[dict[str, Any]]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ceiling = copy_tbs(device)
    rows = []
    for case in cases(size, device):
        row = measure(case, device, ceiling)
        rows.append(row)
        print(f"{case.name:<18} {row['kernel_ms']:8.4f} ms  {row['achieved_tbs']:6.2f} TB/s  "
              f"rel_err {row['rel_err']:.2e}  {_config_text(row)}", flush=True)
    meta = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)",
                torch=torch.__version__, size=size, copy_tbs=ceiling, commit=os.environ.get("KOPT_COMMIT"))
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"kernels-{size}"
    stem.with_suffix(".json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    if _autotune.TUNER.path.exists():
        shutil.copyfile(_autotune.TUNER.path, out_dir / f"autotune-{size}.json")
    lines = [f"# Kernels ({size}) on {meta['device']}, copy ceiling {ceiling} TB/s", "",
             "Times: CUDA-graph replay (GPU time only) for the kernel, eager and torch.compile columns; "
             "`launch ms` is the launcher called from Python (includes host overhead). Bandwidth from kernel ms.",
             "",
             "| kernel | shape | MB | kernel ms | launch ms | eager ms | torch.compile ms | TB/s | of copy | rel err "
             "| config | default ms |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        fraction = "–" if r["fraction_of_copy"] is None else f"{100 * r['fraction_of_copy']:.0f}%"
        compiled = "–" if r["compiled_ms"] is None else f"{r['compiled_ms']:.4f}"
        default = "–" if r["default_ms"] is None else f"{r['default_ms']:.4f}"
        lines.append(f"| {r['kernel']} | {r['shape']} | {r['bytes'] / 1e6:.1f} | {r['kernel_ms']:.4f} | "
                     f"{r['launch_ms']:.4f} | "
                     f"{r['eager_ms']:.4f} | {compiled} | {r['achieved_tbs']:.2f} | {fraction} | {r['rel_err']:.2e} "
                     f"| {_config_text(r)} | {default} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["tiny", "full"], default="full" if torch.cuda.is_available() else "tiny")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    args = parser.parse_args()
    run(args.size, args.out)


if __name__ == "__main__":
    main()
