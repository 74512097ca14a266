"""Does a workload compiled regionally give eager's output on every call? Bisects by setting.

    python benchmarks/tools/replay_check.py --workload llama [--between-blocks outer] [--calls 5]

Compiles the full-size workload as the agent's regional clock does (``kopt.compile(regional=True)``,
whole-forward CUDA-graph replay, no lowering check) and compares each call's first output with the
higher-precision reference (:func:`kopt.reference.reference_forward`; cosine, relative error, with
eager bf16's own error beside them), then again with one setting changed at a time: no replay, no
``staging``, the graphs run op by op (``lower="eager"``). A setting whose calls stay as close to the
reference as eager while the default's do not names the part that goes wrong. Dynamo's recompilations are logged
(``torch._logging`` ``recompiles``) so that a graph compiled on a later call shows with its reason.
Prints one JSON line per setting; ``--out`` also writes them as a file.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from benchmarks.dit.measure import first_tensor  # noqa: E402
from kopt.verify import cosine_similarity, relative_error  # noqa: E402

SETTINGS = {
    "default": dict(),
    "no-replay": dict(cuda_graphs=False),
    "no-staging": dict(drop=("staging",)),
    "lower-eager": dict(lower="eager"),
}


def _agreement(got: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    return {"cosine": cosine_similarity(got, reference), "rel_err": relative_error(got, reference)}


def check(model: torch.nn.Module, inputs: dict, want: torch.Tensor, setting: str, between_blocks: str,
          calls: int) -> dict:
    import kopt
    from kopt.passes.pipeline import default_pipeline
    from kopt.regional import uncompile_blocks

    options = dict(SETTINGS[setting])
    drop = options.pop("drop", ())
    passes = [p for p in default_pipeline() if p.name not in drop]
    options.setdefault("lower", "inductor")
    options.setdefault("cuda_graphs", want.device.type == "cuda")
    began = time.perf_counter()
    compiled = kopt.compile(model, passes=passes, regional=True, check_lowering=False, kb=False,
                            release_weights=False, share_weights=False, on_weight_change="ignore",
                            progress=True, between_blocks=between_blocks, **options)
    rows = []
    with torch.no_grad():
        for index in range(calls):
            rows.append({"call": index, **_agreement(first_tensor(compiled(**inputs)), want)})
    replay = getattr(compiled, "_replay", None)
    result = {"setting": setting, "calls": rows, "seconds": round(time.perf_counter() - began, 1),
              "graphs": [{"index": g.index, "applied": [p.name for p in g.passes if p.matches],
                          "memo": repr(g.memo) if g.memo is not None else None, "fallback": g.fallback}
                         for g in compiled.kopt_report.graphs],
              "replay_disabled": None if replay is None else replay.stats.disabled}
    compiled._kopt_backend.dispose()
    compiled._replay = None
    uncompile_blocks(model)
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    return result


def main() -> None:
    from kopt.workloads import get_workload

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="llama")
    parser.add_argument("--between-blocks", default="outer")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--size", default="full", help="tiny: a CPU rehearsal (no replay there)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    torch._logging.set_logs(recompiles=True)
    workload = get_workload(args.workload)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = workload.model(args.size, device=device, dtype=torch.bfloat16)
    inputs = workload.inputs(args.size, device=device, dtype=torch.bfloat16, seed=0)
    from kopt.reference import reference_forward

    with torch.no_grad():
        want = first_tensor(reference_forward(model, **inputs)).clone()
        eager = _agreement(first_tensor(model(**inputs)), want)
    print(json.dumps({"setting": "eager", **eager}), flush=True)
    results = [{"setting": "eager", **eager}]
    for setting in args.settings.split(","):
        try:
            result = check(model, inputs, want, setting, args.between_blocks, args.calls)
        except Exception as error:  # noqa: BLE001 - a setting that fails is a finding too
            result = {"setting": setting, "error": f"{type(error).__name__}: {error}"[:2000]}
        print(json.dumps(result), flush=True)
        results.append(result)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
