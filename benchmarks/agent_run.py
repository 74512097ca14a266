"""Run the agent's loop on a full-size workload on one GPU within a time budget; write JSON + markdown.

    python -m benchmarks.agent_run --workload flux2 --budget-min 20 --kb $OUT/kb.sqlite

Writes ``agent_<workload>.json`` (under ``--out``, default ``$OUT/benchmarks/results``) and ``.md``
(the candidate table, the environment, the clock) and ``agent_<workload>.png`` (time per region
before/after vs floor). The knowledge base file is meant to be copied back after the run and passed
again next time (resume). Speed is judged by the wall clock on the GPU (never the cost model here),
on the graphs lowered by Inductor by default (``--lower eager``: run as FX op by op).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch


def evaluation_record(e: object) -> dict:
    """One :class:`kopt.agent.loop.Evaluation` as a JSON-ready dict."""
    return {"candidate": e.candidate.content_hash, "region": e.candidate.region_signature,
            "kind": e.candidate.kind.value, "params": dict(e.candidate.params), "status": e.status.value,
            "reason": e.reason, "seconds": e.seconds, "e2e": e.e2e.to_dict() if e.e2e else None}


def evaluation_records(result: object) -> list[dict]:
    """Each evaluation of a :class:`kopt.agent.loop.OptimizeResult`, in order, as JSON-ready dicts."""
    return [evaluation_record(e) for e in result.evaluations]


def partial_writer(path: Path, header: dict) -> object:
    """A callback for ``optimize(on_evaluation=...)`` that rewrites ``path`` after every evaluation with
    those so far (``"finished": false``): a run killed by its lease's time limit keeps what it measured."""
    so_far: list[dict] = []

    def write(evaluation: object) -> None:
        so_far.append(evaluation_record(evaluation))
        path.write_text(json.dumps({**header, "finished": False, "evaluations": so_far}, indent=1, default=str))

    return write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="flux2")
    parser.add_argument("--budget-min", type=float, default=20.0)
    parser.add_argument("--proposer", default="search", choices=["search", "llm", "all"])
    parser.add_argument("--kb", default=None, help="knowledge base file (default $OUT/kb.sqlite)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lower", default="inductor", choices=["inductor", "eager"],
                        help="how the end-to-end A/B runs the graphs (inductor: what kopt.compile users get)")
    parser.add_argument("--regional", action=argparse.BooleanOptionalAction, default=None,
                        help="one graph per block class, each side compiled as kopt.compile(regional=True) "
                             "(default: when the model has repeated blocks)")
    parser.add_argument("--fp8", action="store_true",
                        help="also propose FP8 pipelines (kopt.fp8.Fp8Config(): its quality gate is the contract)")
    parser.add_argument("--between-blocks", default=None, choices=["eager", "linears", "outer", "compiled"],
                        help="what a regional run compiles between the blocks (kopt.compile's between_blocks): eager, "
                             "linears (the large linears), outer (the code around the module that runs the blocks: an "
                             "LLM's LM head and logit cap), compiled (all of the model's code, each block call one op) "
                             "(default: outer when an inner module runs the blocks, else linears with --fp8, "
                             "else eager)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the results (default $OUT/benchmarks/results)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.agent_run needs a CUDA device")
    from kopt.agent.kb import current_environment
    from kopt.agent.loop import optimize
    from kopt.workloads import get_workload

    out = args.out or Path(os.environ.get("OUT", ".")) / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    kb = Path(args.kb) if args.kb else out / "kb.sqlite"
    workload = get_workload(args.workload)
    model = workload.model("full", device="cuda", dtype=torch.bfloat16)
    inputs = workload.inputs("full", device="cuda", dtype=torch.bfloat16, seed=args.seed)
    fp8 = None
    if args.fp8:
        from kopt.fp8.config import Fp8Config

        fp8 = Fp8Config()
    started = time.time()
    stem = f"agent_{workload.name.replace(':', '_')}"
    environment = current_environment()
    header = {"workload": workload.name, "budget_min": args.budget_min, "proposer": args.proposer, "fp8": args.fp8,
              "between_blocks": args.between_blocks,
              "environment": environment.to_dict(), "kb": str(kb)}
    result = optimize(model, inputs, budget_min=args.budget_min, proposer=args.proposer, kb_path=kb,
                      seed=args.seed, model_name=workload.name, progress=True, lower=args.lower,
                      regional=args.regional, fp8=fp8, between_blocks=args.between_blocks,
                      on_evaluation=partial_writer(out / f"{stem}.json", header))
    result.plot(out / f"{stem}.png")
    data = {**header, "finished": True, "clock": result.clock.name,
            "graphs": [{"index": g.index, "calls": g.calls, "nodes": len(g.graph_module.graph.nodes)}
                       for g in result.graphs],
            "side_build_s": list(getattr(result.clock, "build_seconds", [])),
            "wall_s": time.time() - started, "skipped": result.skipped, "resumed": sorted(result.resumed),
            "profile": [{"region": r.region.signature, "occurrences": r.occurrences, "seconds": r.seconds,
                         "floor_s": r.floor.seconds, "bound": r.floor.bound,
                         "lowered_s": result.lowered_s.get(r.region.signature)} for r in result.profile.regions],
            "evaluations": evaluation_records(result),
            "deferred": [dict(c.params) for c in result.deferred]}
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1, default=str))
    (out / f"{stem}.md").write_text(
        f"# kopt optimize {workload.name} (full size, bf16, {environment.describe()})\n\n"
        f"Budget {args.budget_min:g} min, proposer {args.proposer}, clock {result.clock.name}, "
        f"{time.time() - started:.0f} s.\n\n```\n{result.table()}\n```\n\n![regions]({stem}.png)\n")
    print(result.table())


if __name__ == "__main__":
    main()
