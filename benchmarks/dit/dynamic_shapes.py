#!/usr/bin/env python3
"""kopt with static and with dynamic shapes over several resolutions: compile time, ms per forward,
graphs compiled, error against eager.

    python benchmarks/dit/dynamic_shapes.py --size full --model qwen-image      # one H200, ~6-9 min
    python benchmarks/dit/dynamic_shapes.py --size tiny --lower eager           # CPU smoke run

Each variant compiles the same model (``kopt.compile(model, dynamic=...)``, Inductor lowering, CUDA
graphs on) and calls it at each resolution in turn: ``static`` (``dynamic=False``: one graph per
resolution), ``default`` (``dynamic=None``: static first, then one symbolic graph) and ``dynamic``
(``dynamic=True``: one symbolic graph). Per resolution it records the first call's seconds (the
compile, if one happened), the median ms of ``--repeats`` timed calls after ``--warmup``, and the
relative error and cosine against eager on the same inputs; per variant the graphs compiled, the
calls that ran eagerly and the rewrites that fired. What to look for: the symbolic graph's ms
against the static graph's at the same resolution (Inductor's kernels for symbolic sizes, kopt's
kernels autotuned per shape), and one compile instead of one per resolution.

Writes ``dynamic-<size>-<model>.json`` and ``.md`` under ``--out`` (default ``$OUT``, else
``benchmarks/results``), rewritten after each variant.
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

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import kopt  # noqa: E402
from benchmarks.dit.results_io import run_metadata  # noqa: E402
from kopt.workloads import get_workload  # noqa: E402

# (latent patch grid height, width, text tokens): 1024x1024, 768x1344, 512x512 for each model
RESOLUTIONS = {
    "full": {"qwen-image": [(64, 64, 256), (48, 84, 256), (32, 32, 128)],
             "flux2": [(64, 64, 512), (48, 84, 512), (32, 32, 256)]},
    "tiny": {"qwen-image": [(8, 8, 7), (6, 10, 7), (4, 4, 5)], "flux2": [(8, 8, 7), (6, 10, 5), (4, 4, 9)]},
}
VARIANTS = {"static": False, "default": None, "dynamic": True}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    out, ref = out.double().flatten(), ref.double().flatten()
    rel = ((out - ref).norm() / ref.norm()).item()
    cosine = torch.nn.functional.cosine_similarity(out, ref, dim=0).item()
    return rel, cosine


def run_variant(model: torch.nn.Module, calls: list[dict], shapes: list[tuple[int, int, int]], dynamic: bool | None,
                lower: str, device: torch.device, warmup: int, repeats: int, references: list[torch.Tensor]) -> dict:
    compiled = kopt.compile(model, lower=lower, dynamic=dynamic)
    rows = []
    with torch.no_grad():
        for shape, inputs, reference in zip(shapes, calls, references, strict=True):
            def call(inputs: dict = inputs) -> object:
                return compiled(**inputs)

            first = _timed(call, device)
            for _ in range(warmup):
                call()
            times = [_timed(call, device) for _ in range(repeats)]
            rel, cosine = _errors(call()[0], reference)
            rows.append(dict(shape=shape, first_call_s=first, ms=1e3 * statistics.median(times), rel_err_vs_eager=rel,
                             cosine_vs_eager=cosine, graphs_so_far=len(compiled.kopt_report.graphs)))
            print(f"  {shape}: first call {first:.1f} s, {rows[-1]['ms']:.2f} ms, rel {rel:.2e}, "
                  f"graphs {rows[-1]['graphs_so_far']}", flush=True)
    report = compiled.kopt_report
    result = dict(rows=rows, graphs=len(report.graphs), eager_calls=report.eager_calls,
                  fallbacks=[g.fallback for g in report.graphs if g.fallback],
                  rewrites={g.index: {p.name: p.total_matches for p in g.passes} for g in report.graphs},
                  specialized=[n for g in report.graphs for p in g.passes for n in p.notes if "specialized" in n])
    compiled = None
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def write(out: Path, stem: str, record: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1, default=str))
    lines = [f"# kopt, static vs dynamic shapes: {record['model']} ({record['size']}, {record['meta']['device']})", "",
             "| variant | resolution (h, w, text) | first call s | ms | rel err vs eager | cos vs eager | graphs |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, variant in record["variants"].items():
        for row in variant["rows"]:
            lines.append(f"| {name} | {tuple(row['shape'])} | {row['first_call_s']:.1f} | {row['ms']:.2f} | "
                         f"{row['rel_err_vs_eager']:.2e} | {row['cosine_vs_eager']:.6f} | {row['graphs_so_far']} |")
    lines.append("")
    for name, variant in record["variants"].items():
        lines.append(f"- {name}: {variant['graphs']} graph(s), {variant['eager_calls']} eager call(s), "
                     f"fallbacks {variant['fallbacks'] or 'none'}, specializations {variant['specialized'] or 'none'}")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen-image", choices=["qwen-image", "flux2"])
    parser.add_argument("--size", default="full", choices=["full", "tiny"])
    parser.add_argument("--variants", default="static,dynamic", help=f"comma-separated, of {list(VARIANTS)}")
    parser.add_argument("--lower", default="inductor", choices=["inductor", "eager"])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="bfloat16 (default on a GPU) or float32")
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    workload = get_workload(args.model)
    torch.manual_seed(0)
    model = workload.model(args.size, device=device, dtype=dtype)
    base = workload.inputs(args.size, device=device, dtype=dtype, seed=0)
    shapes = RESOLUTIONS[args.size][args.model]
    calls = [workload.resized(base, height=h, width=w, text=t, seed=i) for i, (h, w, t) in enumerate(shapes)]
    with torch.no_grad():
        references = [model(**inputs)[0].float() for inputs in calls]
    record = dict(model=args.model, size=args.size, dtype=str(dtype), lower=args.lower,
                  meta=run_metadata(device), variants={})
    stem = f"dynamic-{args.size}-{args.model}"
    for name in args.variants.split(","):
        print(f"{name} (dynamic={VARIANTS[name]}):", flush=True)
        record["variants"][name] = run_variant(model, calls, shapes, VARIANTS[name], args.lower, device,
                                               args.warmup, args.repeats, references)
        write(Path(args.out), stem, record)
    print((Path(args.out) / f"{stem}.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
