"""``kopt optimize WORKLOAD``: run the agent's loop on a built-in workload or ``module:factory``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path


def _interpreted_triton() -> None:
    """Without a GPU, Triton kernels run in its interpreter, which must be chosen before triton is
    imported (``kopt`` imports it): run this command again in a fresh process with it set."""
    import torch

    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        return
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    os.execve(sys.executable, [sys.executable, "-m", "kopt.cli", *sys.argv[1:]], env)


def _workers(text: str) -> int | str:
    from kopt.agent.pool.workers import parse_workers

    try:
        return parse_workers(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _fp8_config() -> object:
    from kopt.fp8.config import Fp8Config

    return Fp8Config()


def _cmd_optimize(args: argparse.Namespace) -> int:
    _interpreted_triton()
    import torch

    from kopt.agent.loop import optimize
    from kopt.cli_args import workload_argument
    from kopt.workloads import get_workload

    workload = get_workload(workload_argument(args.workload))
    if args.size == "full" and not torch.cuda.is_available():
        raise SystemExit("kopt: --size full needs a CUDA device")
    device, dtype = ("cuda", torch.bfloat16) if args.size == "full" else ("cpu", torch.float32)
    model = workload.model(args.size, device=device, dtype=dtype)
    inputs = workload.inputs(args.size, device=device, dtype=dtype, seed=args.seed)
    result = optimize(model, inputs, budget_min=args.budget_min, proposer=args.proposer, kb_path=args.kb,
                      seed=args.seed, clock="cost-model" if args.cost_model else None, model_name=workload.name,
                      max_candidates=args.max_candidates, progress=args.progress,
                      lower=args.lower or ("inductor" if args.size == "full" else "eager"),
                      micro=args.micro, pipelines=args.pipelines, workers=args.workers, executor=args.executor,
                      regional=args.regional, fp8=_fp8_config() if args.fp8 else None,
                      between_blocks=args.between_blocks)
    print(result.table())
    plot = result.plot(Path(args.plot))
    print(f"plot: {plot}\nknowledge base: {result.kb_path}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "workload": workload.name, "kb": str(result.kb_path), "clock": result.clock.name,
            "evaluations": [{"candidate": e.candidate.content_hash, "region": e.candidate.region_signature,
                             "kind": e.candidate.kind.value, "params": dict(e.candidate.params),
                             "status": e.status.value, "reason": e.reason,
                             "e2e": e.e2e.to_dict() if e.e2e else None} for e in result.evaluations],
            "skipped": result.skipped, "elapsed_s": result.elapsed_s, "pool": result.pool,
            "verified_ahead": [dataclasses.asdict(e) for e in result.verified_ahead]}, indent=1))
    return 0


def add_optimize_parser(commands: argparse._SubParsersAction) -> None:
    command = commands.add_parser("optimize", help="find, verify and keep rewrites for a workload (the agent)")
    command.add_argument("workload", help="a built-in workload name or module:factory (as for explain)")
    command.add_argument("--budget-min", type=float, default=20.0, help="wall-clock budget in minutes")
    command.add_argument("--proposer", choices=["search", "llm", "all"], default="search",
                         help="search (offline, default), llm (anthropic SDK; KOPT_LLM_REPLAY replays), or all")
    command.add_argument("--kb", default=None, help="knowledge base file (default ~/.cache/kopt/kb.sqlite)")
    command.add_argument("--seed", type=int, default=0)
    command.add_argument("--size", choices=["tiny", "full"], default="tiny")
    command.add_argument("--cost-model", action="store_true",
                         help="judge speed with the deterministic cost model instead of the clock (CPU tests)")
    command.add_argument("--max-candidates", type=int, default=None)
    command.add_argument("--lower", choices=["eager", "inductor"], default=None,
                         help="how the end-to-end A/B runs the graphs (default: inductor for --size full, else eager)")
    command.add_argument("--micro", action=argparse.BooleanOptionalAction, default=True,
                         help="time region candidates alone first and stop those not 1%% faster")
    command.add_argument("--pipelines", action=argparse.BooleanOptionalAction, default=True,
                         help="also propose pipeline choices (opt-in/left-out passes, attention backends)")
    command.add_argument("--workers", type=_workers, default="auto",
                         help="verification workers: auto (one per GPU, the timing GPU left out; one with CPU timing) "
                              "or N; beyond one, candidates are verified ahead of the serial timing")
    command.add_argument("--executor", choices=["local", "ray"], default="local",
                         help="where workers run: local processes, or Ray tasks (pip install 'kopt[ray]')")
    command.add_argument("--fp8", action="store_true",
                         help="also propose FP8 pipelines per scale granularity and FP8 attention, each judged "
                              "against kopt.fp8.Fp8Config()'s quality gate")
    command.add_argument("--regional", action=argparse.BooleanOptionalAction, default=None,
                         help="one graph per repeated block class, timed as kopt.compile(regional=True) runs the "
                              "whole forward (default: with --lower inductor when the model has repeated blocks)")
    command.add_argument("--between-blocks", choices=["eager", "linears", "outer", "compiled"], default=None,
                         help="what a regional run compiles between the blocks (kopt.compile's between_blocks): eager, "
                              "linears (the large linears), outer (the code around the module that runs the blocks: an "
                              "LLM's LM head and logit cap), compiled (all of the model's code, a block call one op) "
                              "(default: outer when an inner module runs the blocks, else linears with --fp8, "
                              "else eager)")
    command.add_argument("--plot", default="kopt_optimize.png", help="where to write the per-region plot (PNG)")
    command.add_argument("--json", default=None, help="also write the evaluations as JSON here")
    command.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    command.set_defaults(run=_cmd_optimize)
