"""A workload's whole output under several ``kopt.compile`` configurations, each against the
higher-precision reference and eager, with what the compile did: the check to run when a model-level
verdict looks wrong.

Why: in the agent's first GPU run on Gemma 2 (``benchmarks/results/agent_gemma2-s26f.md``) every
side with FP8 anywhere, the LM head alone included, gave a model output at cosine 0.016 against the
reference, while each graph's own check passed; on the CPU the same choices stay near eager. This
separates the causes: the lowering (Inductor against FX), the whole-forward CUDA-graph replay, the
code between the blocks, and FP8 itself. Each configuration is compiled on the same module (undone
after), called three times (compile, warm-up and recording, replay), and each call's output is
compared; eager is called again after the undo, so a configuration that damaged the module shows.

    python -m benchmarks.tools.compiled_model_accuracy --workload gemma2 --out results.json
    python -m benchmarks.tools.compiled_model_accuracy --workload gemma2 --size tiny  # CPU smoke run

Writes JSON: per configuration the three calls' ``rel``/``cos``/``finite``, compile seconds, how
many linears FP8 took, the replay's status and eager after the undo.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

import torch

CONFIGS: dict[str, dict[str, Any]] = {
    "bf16 regional linears": dict(regional=True, between_blocks="linears"),
    "fp8 regional linears": dict(regional=True, between_blocks="linears", fp8=True),
    "fp8 regional linears no graphs": dict(regional=True, between_blocks="linears", fp8=True, cuda_graphs=False),
    "fp8 regional eager-between": dict(regional=True, fp8=True),
    "fp8 regional linears eager-lowering": dict(regional=True, between_blocks="linears", fp8=True, lower="eager"),
}


def numbers(out: torch.Tensor, reference: torch.Tensor) -> dict[str, Any]:
    """rel / cos of ``out`` against ``reference`` (float64, :func:`kopt.verify.distance`) and finiteness."""
    from kopt.verify import distance

    measured = distance(out, reference)
    return dict(rel=measured.rel_err, cos=measured.cosine, finite=bool(torch.isfinite(out).all()))


def run(workload_name: str, size: str, names: list[str]) -> dict[str, Any]:
    import kopt
    from kopt.fp8 import Fp8Config
    from kopt.reference import reference_forward
    from kopt.workloads import get_workload

    device = "cuda" if torch.cuda.is_available() else "cpu"
    workload = get_workload(workload_name)
    torch.manual_seed(0)
    model = workload.model(size, device=device, dtype=torch.bfloat16).eval()
    inputs = workload.inputs(size, device=device, dtype=torch.bfloat16, seed=1)
    rows: dict[str, Any] = {"workload": workload_name, "size": size, "device": device}
    with torch.no_grad():
        reference = reference_forward(model, **inputs)[0]
        rows["eager"] = numbers(model(**inputs)[0], reference)
        print("eager", json.dumps(rows["eager"]), flush=True)
        for name in names:
            options = {**CONFIGS[name], "release_weights": False, "share_weights": False, "progress": False}
            if options.get("fp8") is True:
                options["fp8"] = Fp8Config(min_features=16 if size == "tiny" else 1024)
            began, compiled = time.perf_counter(), None
            try:
                compiled = kopt.compile(model, **options)
                calls = [numbers(compiled(**inputs)[0], reference) for _ in range(3)]
                report = compiled.kopt_report
                row = dict(calls=calls, seconds=time.perf_counter() - began, fp8_linears=report.matches("fp8-linear"),
                           replay=report.forward_replay.describe() if report.forward_replay is not None else None)
                compiled.undo()
                row["eager_after_undo"] = numbers(model(**inputs)[0], reference)
            except Exception as error:  # noqa: BLE001 - one configuration failing is a finding, not the end
                row = dict(error=f"{type(error).__name__}: {error}"[:500])
            rows[name] = row
            print(name, json.dumps(row), flush=True)
            del compiled
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--size", choices=("full", "tiny"), default="full")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of: {', '.join(CONFIGS)}")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration(s) {unknown}; known: {list(CONFIGS)}")
    rows = run(args.workload, args.size, names)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
