#!/usr/bin/env python3
"""What watching weights for changes costs per call (``weight_check="checksum"`` against ``"version"``).

    python benchmarks/dit/weight_guard.py                                   # tiny Qwen-Image, fp32, CPU
    python benchmarks/dit/weight_guard.py --width full --blocks 2 --dtype bf16    # Qwen-Image's width, 2 of 60 blocks
    python benchmarks/dit/weight_guard.py --width full --blocks 60 --dtype bf16 --device cuda --lower inductor \
        --grid 64 --text 256 [--fp8]                        # the 20B model at 1024x1024, on a GPU

kopt reads the weights no pass transformed live and watches only those that a derived constant
(merged, quantized, folded) or the memoized step-invariant stage was computed from
(kopt/weight_guard.py). This compiles Qwen-Image with random weights (lower="eager" by default:
the guard does not depend on the lowering), then times the guard alone on the watched weights:
the checksum (one read of them per call, one flag read back per device) and the version check (no
read); and whole calls of the same compiled model with the guard swapped (none / version /
checksum): on a GPU the checksum runs on a side stream beside the forward, so the whole-call
difference is what it really costs. The guard's cost scales with the watched bytes, so the
markdown also extrapolates from the watched fraction of this model's parameters to the 20.4B
model at a stated bandwidth; on a GPU, run it at full depth instead. Writes
benchmarks/results/weight-guard-<device>-<width>-<blocks>[-fp8]-<dtype>.{json,md} (``--out`` moves them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import kopt  # noqa: E402
from benchmarks.dit.results_io import run_metadata  # noqa: E402
from kopt.config import WeightCheck  # noqa: E402
from kopt.weight_guard import WeightGuard  # noqa: E402
from kopt.workloads import qwen_image  # noqa: E402

QWEN_IMAGE_PARAMETERS = 20.4e9  # the published configuration (kopt/workloads/qwen_image.py FULL)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_ms(fn, device: torch.device, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        fn()
        _synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _model_and_inputs(width: str, blocks: int, dtype: torch.dtype, device: torch.device, grid: int, text: int):
    from diffusers import QwenImageTransformer2DModel

    config = dict(qwen_image.FULL if width == "full" else qwen_image.TINY, num_layers=blocks)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = QwenImageTransformer2DModel(**config).eval().requires_grad_(False)
    finally:
        torch.set_default_dtype(previous)
    grid = (grid, grid)
    generator = torch.Generator().manual_seed(1)
    inputs = dict(
        hidden_states=torch.randn(1, grid[0] * grid[1], config["in_channels"], generator=generator),
        encoder_hidden_states=torch.randn(1, text, config["joint_attention_dim"], generator=generator),
        encoder_hidden_states_mask=torch.ones(1, text, dtype=torch.long),
        timestep=torch.full((1,), 0.5), img_shapes=[(1, *grid)], return_dict=False)
    inputs = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
              if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return model, inputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", choices=("tiny", "full"), default="tiny", help="Qwen-Image's tiny or full width")
    parser.add_argument("--blocks", type=int, default=2, help="transformer blocks (the full model has 60)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--fp8", action="store_true", help="with kopt's FP8 linears (every linear is derived)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--grid", type=int, default=8,
                        help="latent patch grid side: 8 = 64 image tokens (CPU); 64 = 4096 (1024x1024, on a GPU)")
    parser.add_argument("--text", type=int, default=16, help="text tokens (the pipeline's: 256)")
    parser.add_argument("--lower", choices=("eager", "inductor"), default="eager",
                        help="lowering of the compiled model whose calls are timed (the guard does not depend on it)")
    parser.add_argument("--bandwidth-tbs", type=float, default=3.0,
                        help="achievable read bandwidth of the extrapolation, TB/s (H200: ~3-4)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results"))
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    if device.type == "cpu":
        torch.set_num_threads(1)  # a shared machine: one core's bandwidth, stated

    model, inputs = _model_and_inputs(args.width, args.blocks, dtype, device, args.grid, args.text)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    fp8 = kopt.fp8.Fp8Config(min_features=16) if args.fp8 else None
    compiled = kopt.compile(model, lower=args.lower, fp8=fp8)
    with torch.no_grad():
        start = time.perf_counter()
        compiled(**inputs)
        compile_s = time.perf_counter() - start
    graphs = [g.weights for g in compiled._kopt_backend.compiled if g.weights is not None and g.weights.guard]
    guards = {"checksum": [g.guard for g in graphs],
              "version": [WeightGuard(list(g.guard.tensors), WeightCheck.VERSION, g.guard.tensors) for g in graphs],
              "none": [None for _ in graphs]}
    calls_ms = {}
    with torch.no_grad():
        for check, chosen in guards.items():  # the same compiled graphs, the guard swapped: whole calls
            for graph, guard in zip(graphs, chosen, strict=True):
                graph.guard = guard
            calls_ms[check] = _median_ms(lambda: compiled(**inputs), device, max(3, args.repeats // 2))
        for graph, guard in zip(graphs, guards["checksum"], strict=True):
            graph.guard = guard
    call_ms = calls_ms["none"]

    rows = []
    for graph in compiled._kopt_backend.compiled:
        if graph.weights is None or graph.weights.guard is None:
            continue
        watched = graph.weights.guard.tensors
        version = WeightGuard(list(watched), WeightCheck.VERSION, watched)
        checksum_ms = _median_ms(lambda g=graph.weights.guard, w=watched: g.changed(w), device, args.repeats)
        version_ms = _median_ms(lambda g=version, w=watched: g.changed(w), device, args.repeats)
        watched_bytes = graph.weights.guard.watched_bytes
        # the extrapolation counts parameters only (Qwen-Image also watches its RoPE frequency tables, 2 MiB)
        fraction = sum(t.numel() * t.element_size() for t in watched.values()
                       if isinstance(t, torch.nn.Parameter)) / parameter_bytes
        full_bytes = fraction * QWEN_IMAGE_PARAMETERS * 2  # bf16
        rows.append(dict(graph=graph.report.index, weights=graph.report.weights, watched_tensors=len(watched),
                         watched_mib=watched_bytes / 2**20, parameter_mib=parameter_bytes / 2**20,
                         watched_fraction=fraction, checksum_ms=checksum_ms, version_ms=version_ms,
                         checksum_gbs=watched_bytes / checksum_ms / 1e6 if checksum_ms else None,
                         call_ms=call_ms, calls_ms=calls_ms,
                         estimate_20b_gb=full_bytes / 1e9,
                         estimate_20b_ms=full_bytes / (args.bandwidth_tbs * 1e12) * 1e3))
    meta = run_metadata(device)
    result = dict(meta=meta, args=vars(args), compile_s=compile_s, rows=rows)
    name = f"weight-guard-{device.type}-{args.width}-{args.blocks}{'-fp8' if args.fp8 else ''}-{args.dtype}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2, default=str))
    lines = [f"# {name}", "", f"{meta['device']}, torch {meta['torch']}, commit {meta['git_commit']}; Qwen-Image "
             f"width {args.width}, {args.blocks} blocks, {args.dtype}{', FP8 linears' if args.fp8 else ''}; "
             f"{'one CPU thread' if device.type == 'cpu' else device}", "",
             "| graph | watched tensors | watched MiB | watched parameters | checksum ms/call | GB/s | version ms/call "
             f"| call ms ({args.lower}): no check / version / checksum | 20.4B bf16: watched GB | ms at "
             f"{args.bandwidth_tbs:g} TB/s |",
             "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['graph']} | {r['watched_tensors']} | {r['watched_mib']:,.1f} | {r['watched_fraction']:.1%} "
                     f"| {r['checksum_ms']:.3f} | {r['checksum_gbs'] or 0:.1f} | {r['version_ms']:.3f} "
                     f"| {r['calls_ms']['none']:.2f} / {r['calls_ms']['version']:.2f} "
                     f"/ {r['calls_ms']['checksum']:.2f} "
                     f"| {r['estimate_20b_gb']:.1f} | {r['estimate_20b_ms']:.1f} |")
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
