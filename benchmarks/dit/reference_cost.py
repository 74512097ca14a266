#!/usr/bin/env python3
"""What the higher-precision reference, and so the lowering check, costs on a model.

    python benchmarks/dit/reference_cost.py --size full --models qwen-image          # one H200 (bf16, fp32 reference)
    python benchmarks/dit/reference_cost.py --size full --models flux1 --compile  # + kopt.compile's check, as reported
    python benchmarks/dit/reference_cost.py --models tiny-flux1,mid-flux1  # the CPU (fp32 model, fp64 reference)

Per model: one eager forward (median of 3), one reference forward (``kopt.reference``: every op in
fp32 on a GPU / fp64 on the CPU, weights upcast op by op; median of 2), the peak bytes of upcast
weight copies alive at once, the GPU's peak memory during the reference against the model's own,
and eager's error against the reference. With ``--compile``, also ``kopt.compile(model)``'s first
call (Inductor, lowering check on): its seconds, the check's own seconds as the report gives them
(reference, op-by-op and lowered calls) and the check's numbers.

The check runs once per compilation, on the first call; what it costs against the compile it
follows is what decides whether it can stay on by default. ``tiny-flux1`` / ``mid-flux1`` are
FLUX.1's structure (guidance embeddings) at tiny width and at width 1024 with 2+4 blocks and 384
tokens, for the CPU; full-size models come from ``kopt.workloads`` (``flux1`` once the zoo has it).
Writes ``reference-cost-<size>[-tag].{json,md}`` to ``--out`` (default ``$OUT``, else
``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.dit import results_io  # noqa: E402
from benchmarks.dit.measure import compare, first_tensor, synchronize  # noqa: E402
from kopt.reference import ReferenceStats, reference_forward  # noqa: E402
from kopt.workloads import Workload, get_workload  # noqa: E402
from kopt.workloads.base import randn  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# FLUX.1's structure for the CPU: (double blocks, single blocks, heads, head dim, its RoPE axes, grid side, text)
FLUX1_CPU = {"tiny-flux1": (1, 1, 2, 16, (4, 6, 6), 4, 5), "mid-flux1": (2, 4, 8, 128, (16, 56, 56), 16, 128)}


def _flux1_cpu(name: str) -> Workload:
    double, single, heads, head_dim, axes, side, text = FLUX1_CPU[name]
    width = heads * head_dim

    def build_model(size: str) -> torch.nn.Module:
        from diffusers import FluxTransformer2DModel

        return FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=double, num_single_layers=single,
                                      attention_head_dim=head_dim, num_attention_heads=heads,
                                      joint_attention_dim=width, pooled_projection_dim=width // 2,
                                      guidance_embeds=True, axes_dims_rope=axes)

    def build_inputs(size: str, device: torch.device, dtype: torch.dtype, generator: torch.Generator,
                     negative: bool) -> dict[str, Any]:
        ids = torch.cartesian_prod(torch.zeros(1), torch.arange(side).float(), torch.arange(side).float())
        return dict(hidden_states=randn((1, side * side, 64), generator, device, dtype),
                    encoder_hidden_states=randn((1, text, width), generator, device, dtype),
                    pooled_projections=randn((1, width // 2), generator, device, dtype),
                    timestep=torch.full((1,), 0.5, device=device, dtype=dtype), img_ids=ids.to(device),
                    txt_ids=torch.zeros(text, 3, device=device),
                    guidance=torch.full((1,), 3.5, device=device, dtype=torch.float32), return_dict=False)

    return Workload(name=name, description=f"FLUX.1 structure, {double}+{single} blocks, width {width}",
                    build_model=build_model, build_inputs=build_inputs)  # type: ignore[arg-type]


def _workload(name: str) -> Workload:
    return _flux1_cpu(name) if name in FLUX1_CPU else get_workload(name)


def _seconds(fn: Any, device: torch.device, repeats: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        result = fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def measure(name: str, size: str, device: torch.device, dtype: torch.dtype, compile_too: bool) -> dict[str, Any]:
    workload = _workload(name)
    torch.manual_seed(0)
    model = workload.model(size, device=device, dtype=dtype)  # type: ignore[arg-type]
    inputs = workload.inputs(size, device=device, dtype=dtype, seed=0)  # type: ignore[arg-type]
    params = sum(p.numel() for p in model.parameters())
    row: dict[str, Any] = dict(model=name, size=size, parameters=params, dtype=str(dtype).removeprefix("torch."))
    with torch.no_grad():
        row["eager_s"], eager = _seconds(lambda: first_tensor(model(**inputs)), device, 3)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    stats = ReferenceStats()
    row["reference_s"], reference = _seconds(lambda: first_tensor(reference_forward(model, **inputs, stats=stats)),
                                             device, 2)
    row["reference_dtype"] = str(reference.dtype).removeprefix("torch.")
    row["peak_upcast_gb"] = stats.peak_live_bytes / 1e9
    if device.type == "cuda":
        row["model_gb"] = before / 1e9
        row["reference_peak_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    row["reference_over_eager"] = row["reference_s"] / row["eager_s"]
    row["eager_vs_reference"] = compare(eager, reference)
    print(f"{name}: {params / 1e6:.1f} M parameters; eager {row['eager_s']:.3f} s, reference "
          f"({row['reference_dtype']}) {row['reference_s']:.3f} s = {row['reference_over_eager']:.1f}x eager; "
          f"upcast copies at most {row['peak_upcast_gb']:.3f} GB; eager vs reference {row['eager_vs_reference']}",
          flush=True)
    if compile_too:
        row.update(_compile(model, inputs, device))
    return row


def _compile(model: torch.nn.Module, inputs: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """kopt.compile's first call with the lowering check on, and the check's cost as the report gives it."""
    import kopt

    torch._dynamo.reset()
    compiled = kopt.compile(model)
    with torch.no_grad():
        first_s, _ = _seconds(lambda: compiled(**inputs), device, 1)
    graphs = compiled.kopt_report.graphs
    checks = [g.lowering_check for g in graphs if g.lowering_check is not None]
    out = dict(first_call_s=first_s, check_s=sum(c.seconds for c in checks), check_ok=all(c.ok for c in checks),
               check_outputs=[o for c in checks for o in c.outputs], check_notes=[c.note for c in checks if c.note],
               hazards=[h.describe() for g in graphs for h in g.hazards])
    print(f"  kopt.compile first call {first_s:.1f} s, of which the lowering check {out['check_s']:.1f} s "
          f"({'passed' if out['check_ok'] else 'FAILED'}); {[o['verdict'] for o in out['check_outputs']]}",
          flush=True)
    torch._dynamo.reset()
    return out


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"# Reference and lowering-check cost ({meta['device']}, torch {meta['torch']}, commit "
             f"{(meta['git_commit'] or 'unknown')[:12]})", "",
             "| model | params M | dtype | eager s | reference | reference s | × eager | upcast GB | model GB "
             "| peak GB | eager rel err vs ref | kopt first call s | check s | check |",
             "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    def cell(r: dict[str, Any], key: str, digits: int = 3) -> str:
        value = r.get(key)
        return "–" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    for r in rows:
        lines.append(f"| {r['model']} | {r['parameters'] / 1e6:.1f} | {r['dtype']} | {cell(r, 'eager_s')} "
                     f"| {r['reference_dtype']} | {cell(r, 'reference_s')} | {cell(r, 'reference_over_eager', 1)} "
                     f"| {cell(r, 'peak_upcast_gb')} | {cell(r, 'model_gb', 1)} | {cell(r, 'reference_peak_gb', 1)} "
                     f"| {r['eager_vs_reference']['rel_err']:.3e} | {cell(r, 'first_call_s', 1)} "
                     f"| {cell(r, 'check_s', 1)} "
                     f"| {'–' if 'check_ok' not in r else 'passed' if r['check_ok'] else 'FAILED'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny-flux1,mid-flux1",
                        help=f"workload names, module:factory, or the CPU configs {sorted(FLUX1_CPU)}")
    parser.add_argument("--size", choices=["tiny", "full"], default="tiny")
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--compile", action="store_true", help="also time kopt.compile's first call and its check")
    parser.add_argument("--out", default=None)
    parser.add_argument("--tag", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES[args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    out = Path(args.out or os.environ.get("OUT") or results_io.REPO / "benchmarks" / "results")
    out.mkdir(parents=True, exist_ok=True)
    meta = results_io.run_metadata(device)
    rows = []
    stem = "-".join(["reference-cost", args.size, *([args.tag] if args.tag else [])])
    for name in (m.strip() for m in args.models.split(",") if m.strip()):
        try:
            rows.append(measure(name, args.size, device, dtype, args.compile))
            gc.collect()  # the model of the last row goes before the next one is built
            if device.type == "cuda":
                torch.cuda.empty_cache()
        except Exception as error:  # noqa: BLE001 - keep the other models' rows
            print(f"{name} FAILED: {type(error).__name__}: {error}", flush=True)
            rows.append(dict(model=name, error=f"{type(error).__name__}: {error}"))
        measured = [r for r in rows if "error" not in r]
        (out / f"{stem}.json").write_text(json.dumps(results_io._clean(dict(meta=meta, rows=rows)), indent=2) + "\n")
        (out / f"{stem}.md").write_text(markdown(measured, meta))
    print(markdown([r for r in rows if "error" not in r], meta), flush=True)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
