"""Llama-3.1-8B prefill (2,048 tokens) on one GPU: ``kopt.compile(passes="auto", regional=True)`` against
torch.compile regional (each block's ``.compile()``), both with whole-forward CUDA-graph replay attempted
the same way (kopt's own, and :class:`benchmarks.dit.graph_replay.ReplayedForward` for the baseline),
in one process (``llama-breakdown-s23b.txt`` is its output). Per side: the first call's seconds
(compile included), the median ms per forward (CUDA events, 30 calls after 3 warm-up calls), whether it replayed and why
not, and the profiler's kernel time per forward by kernel. ``kopt_vs_eager_rel`` is the distance to
eager bf16 only, a sanity figure, not a quality verdict (the agent judges against the fp32 reference).

    python -m benchmarks.tools.llama_vs_compile_probe --out llama-vs-compile.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.tools.llama_micro_probe import kernels_per_forward, median_ms


def main() -> None:
    import kopt
    from benchmarks.dit.graph_replay import ReplayedForward
    from kopt.regional import repeated_blocks, uncompile_blocks
    from kopt.workloads import get_workload

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    out: dict = {}

    def breakdown(fn, label: str) -> None:
        rows = kernels_per_forward(fn)
        out[label + "_kernels"] = rows[:20]
        out[label + "_kernel_total_ms"] = sum(r[0] for r in rows)
        print(f"{label} kernel total {out[label + '_kernel_total_ms']:.2f} ms", flush=True)
        for ms, count, name in rows[:12]:
            print(f"  {ms:8.3f} ms {count:5d}  {name}", flush=True)

    workload = get_workload("llama")
    model = workload.model("full", device="cuda", dtype=torch.bfloat16)
    inputs = workload.inputs("full", device="cuda", dtype=torch.bfloat16)
    began = time.perf_counter()
    compiled = kopt.compile(model, passes="auto", regional=True, progress=False)
    with torch.no_grad():
        compiled(**inputs)
        out["kopt_first_call_s"] = time.perf_counter() - began
        out["kopt_ms"] = median_ms(lambda: compiled(**inputs), 30, warmup=3)
        report = compiled.kopt_report
        out["kopt_replay"] = report.forward_replay.describe()
        out["kopt_eager_calls"] = report.eager_calls
        print("kopt", out["kopt_ms"], out["kopt_replay"], "eager calls", report.eager_calls, flush=True)
        breakdown(lambda: compiled(**inputs), "kopt")
        check = compiled(**inputs)[0].float()
    uncompile_blocks(model)
    torch._dynamo.reset()
    with torch.no_grad():
        eager = model(**inputs)[0].float()
        out["kopt_vs_eager_rel"] = ((check - eager).norm() / eager.norm()).item()
        began = time.perf_counter()
        for block in repeated_blocks(model):
            block.compile()
        baseline = ReplayedForward(model)
        baseline(**inputs)
        out["tc_first_call_s"] = time.perf_counter() - began
        out["tc_ms"] = median_ms(lambda: baseline(**inputs), 30, warmup=3)
        out["tc_replayed"], out["tc_status"] = baseline.replayed, baseline.status()
        print("torch.compile regional + replay", out["tc_ms"], out["tc_replayed"], out["tc_status"], flush=True)
        breakdown(lambda: baseline(**inputs), "tc")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(json.dumps({k: v for k, v in out.items() if "kernels" not in k}, default=str))


if __name__ == "__main__":
    main()
