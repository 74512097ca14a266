"""The ``kopt`` command line: ``demo``, ``passes``, ``explain``, ``kb``, ``optimize``."""

from __future__ import annotations

import argparse
import json
import sys

from kopt.cli_args import workload_argument
from kopt.passes.pipeline import default_pipeline, opt_in_passes


def _cmd_passes(args: argparse.Namespace) -> int:
    print('passes="auto", in order:')
    for position, rewrite in enumerate(default_pipeline(), 1):
        print(f"{position}. {rewrite.name}  [{rewrite.contract.describe()}]\n   {rewrite.why}")
    print("\nopt-in (name them in passes=[...]; fp8=... adds fp8-linear and, with row scales, the producer "
          "fusions fuse-activation-quant and fuse-adaln-quant and fp8-gemv; Fp8Config(attention=True) adds "
          "fp8-attention and, with row scales, fuse-attention-output-quant):")
    for rewrite in opt_in_passes():
        print(f"- {rewrite.name}  [{rewrite.contract.describe()}]\n   {rewrite.why}")
    return 0


def _passes(spec: str) -> str | list[str]:
    """``auto`` or a comma-separated list of pass names (``kopt passes`` lists them), validated."""
    from kopt.passes.pipeline import resolve

    passes = "auto" if spec == "auto" else [name.strip() for name in spec.split(",") if name.strip()]
    try:
        resolve(passes)
    except ValueError as error:
        raise SystemExit(f"kopt: {error}") from None
    return passes


def _fp8(args: argparse.Namespace) -> object:
    """The ``--fp8`` / ``--fp8-attention`` options as an Fp8Config (None without ``--fp8``). Tiny models
    have 64-wide layers, all quantized, so they get a looser gate (0.99 cosine, 18 dB)."""
    if args.fp8 is None:
        if args.fp8_attention:
            raise SystemExit("kopt: --fp8-attention needs --fp8 GRANULARITY")
        return None
    from kopt.fp8 import Fp8Config, QualityGate

    tiny = args.size == "tiny"
    return Fp8Config(granularity=args.fp8, attention=args.fp8_attention, min_features=16 if tiny else 1024,
                     gate=QualityGate(min_cosine=0.99, min_sqnr_db=18.0) if tiny else QualityGate())


def _cmd_explain(args: argparse.Namespace) -> int:
    import torch

    from kopt.demo import explain, placement, summary_line

    try:
        placement(args.size)
    except ValueError as error:
        raise SystemExit(f"kopt: {error}") from None
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    result = explain(workload_argument(args.workload), size=args.size, lower=args.lower, passes=_passes(args.passes),
                     fp8=_fp8(args), progress=args.progress, dtype=dtypes[args.dtype] if args.dtype else None)
    if args.json:
        print(json.dumps({**result, "report": result["report"].to_dict()}, indent=1, default=str))
    else:
        print(result["report"])
        print("\n" + summary_line(result))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from kopt.demo import explain, summary_line

    print("kopt demo: tiny Qwen-Image and FLUX.2 transformers (diffusers classes, random weights) on "
          f"the CPU, lowered with {args.lower}. CPU times are a sanity figure, not a benchmark.\n")
    lines = []
    for name in args.models.split(","):
        result = explain(workload_argument(name), lower=args.lower, passes=_passes(args.passes), progress=args.progress)
        print(f"=== {name} ===")
        print(result["report"])
        print()
        lines.append(summary_line(result))
    print("=== summary (fresh random inputs; reference: the same weights in float64) ===")
    print("\n".join(lines))
    return 0


LOWER_HELP = ("what runs the rewritten graph: inductor (default, as kopt.compile: generated kernels, tens of "
              "seconds of C++ compile per graph on a CPU) or eager (the graph op by op: compiles in seconds, "
              "slower to run; the report and the pass decisions are the same)")
PROGRESS_HELP = ("show each compile step (capture, every pass, lowering, autotuning) on stderr, as a status line "
                 "on a terminal (default: on)")


def _add_common(command: argparse.ArgumentParser) -> None:
    command.add_argument("--lower", choices=["inductor", "eager"], default="inductor", help=LOWER_HELP)
    command.add_argument("--passes", default="auto", help="auto, or pass names separated by commas (kopt passes)")
    command.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help=PROGRESS_HELP)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kopt", description="verified graph rewrites for PyTorch inference")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="compile tiny Qwen-Image and FLUX.2 on the CPU and report")
    demo.add_argument("--models", default="qwen-image,flux2",
                      help="workloads separated by commas (names or module:factory, as for explain)")
    _add_common(demo)
    demo.set_defaults(run=_cmd_demo)
    passes = commands.add_parser("passes", help="list the default pipeline with each pass's why and contract")
    passes.set_defaults(run=_cmd_passes)
    explain = commands.add_parser("explain", help="compile one workload and print kopt's report")
    explain.add_argument("workload", help="qwen-image, flux2, or module:factory: an importable module and a "
                                          "name in it that is, or takes no arguments and returns, a "
                                          "kopt.workloads.Workload (the model factory and its example inputs)")
    explain.add_argument("--size", choices=["tiny", "full"], default="tiny",
                         help="tiny (default: the workload's small configuration of its real architecture, "
                              "random weights, on the CPU in float32) or full (the published configuration, "
                              "random weights, on the GPU in bfloat16; refused without a CUDA device)")
    _add_common(explain)
    explain.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default=None,
                         help="the model's dtype (default: fp32 at tiny size, bf16 at full size); precision "
                              "hazards show in bf16/fp16")
    explain.add_argument("--json", action="store_true", help="print the report as JSON")
    explain.add_argument("--fp8", choices=["row", "tensor", "block-1x128", "block-128x128"],
                         help="also quantize the linears to FP8 with this scale granularity")
    explain.add_argument("--fp8-attention", action="store_true", help="with --fp8: attention in FP8 too")
    explain.set_defaults(run=_cmd_explain)
    from kopt.agent.cli import add_optimize_parser
    from kopt.agent.kb.cli import add_kb_parser

    add_kb_parser(commands)
    add_optimize_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
