"""The installed entry points: ``torch.compile(backend="kopt")`` without importing kopt, and the CLI."""

from __future__ import annotations

import argparse
import inspect
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kopt
from kopt.cli import build_parser
from kopt.config import Lowering
from kopt.passes.base import Contract

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, timeout: int = 600, cwd: str | Path = "/") -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=timeout, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_torch_compile_backend_kopt_in_a_fresh_process():
    """The entry point resolves "kopt" in a process that never imported kopt; Inductor lowers it."""
    out = _run("""
        import sys, torch
        assert "kopt" in torch._dynamo.list_backends(), torch._dynamo.list_backends()
        assert "kopt" not in sys.modules
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)).eval()
        compiled = torch.compile(model, backend="kopt")
        x = torch.randn(8, 32)
        with torch.no_grad():
            ref, out = model(x), compiled(x)
        err = ((out - ref).norm() / ref.norm()).item()
        import kopt
        report = kopt.last_backend_report()
        print(err, len(report.graphs), report.graphs[0].lowering)
    """)
    err, graphs, lowering = out.split()[:3]
    assert float(err) < 1e-5 and int(graphs) == 1 and lowering == "inductor"


def test_backend_options_reach_kopt():
    """options={...} takes kopt.compile's keywords (here: eager lowering, verification); the output keeps
    the fired passes' contract against a float64 reference."""
    out = _run("""
        import torch
        from kopt.workloads import get_workload
        w = get_workload("flux2")
        model, inputs = w.model("tiny"), w.inputs("tiny", seed=3)
        compiled = torch.compile(model, backend="kopt", options={"lower": "eager", "verify": True})
        with torch.no_grad():
            eager, out = model(**inputs)[0], compiled(**inputs)[0]
        import kopt
        from tests.contracts import assert_within_contract, float64_output
        report = kopt.last_backend_report()
        assert_within_contract(out, eager=eager, float64=float64_output(model, inputs), report=report)
        graph = report.graphs[0]
        print(graph.lowering, graph.verification[0]["ok"], graph.fallback)
    """, cwd=ROOT)  # from the checkout, for tests.contracts
    assert out.startswith("eager True None"), out


def test_cli_passes_lists_the_pipeline():
    out = subprocess.run(["kopt", "passes"], capture_output=True, text=True, check=True).stdout
    assert "redundancy" in out and "[exact]" in out


def _fired_contract(graph: dict) -> kopt.Contract:
    """The combined contract of the built-in passes that fired in one graph of a JSON report."""
    contract, passes = kopt.Contract.exact(), kopt.available_passes()
    for record in graph["passes"]:
        if sum(record["matches"].values()):
            contract = contract.combine(passes[record["name"]].contract)
    return contract


def test_cli_explain_json():
    """The JSON report of the default pipeline, whose error against eager is within the contract of the
    passes that fired (verified on the first call too)."""
    result = subprocess.run(["kopt", "explain", "qwen-image", "--json", "--lower", "eager"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    decoded = json.loads(result.stdout)
    graph = decoded["report"]["graphs"][0]
    assert graph["passes"][0]["name"] == "redundancy" and graph["fallback"] is None
    contract = _fired_contract(graph)
    assert contract.kind is kopt.ContractKind.TOLERANCE  # sibling-merge and bias-absorption fire
    assert 0 <= decoded["rel_err_vs_eager"] <= contract.rel_tol and decoded["cosine_vs_eager"] > 1 - contract.rel_tol
    assert graph["verification"] and all(check["ok"] for check in graph["verification"])
    # against the float64 reference: kopt (fp32, run as FX) is as close as eager is
    assert decoded["rel_err"] < 1e-5 and decoded["rel_err"] <= decoded["eager_rel_err"] + 1e-6
    assert decoded["report"]["graphs"][0]["passes"][0]["name"] == "redundancy"


def test_cli_explain_fp8_reports_the_fp8_passes_and_the_quality():
    result = subprocess.run(["kopt", "explain", "flux2", "--fp8", "row", "--fp8-attention", "--json",
                             "--lower", "eager"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    decoded = json.loads(result.stdout)
    names = [p["name"] for p in decoded["report"]["graphs"][0]["passes"]]
    assert {"fp8-linear", "fuse-activation-quant", "fp8-attention"} <= set(names)
    assert decoded["report"]["graphs"][0]["fallback"] is None  # the tiny gate (0.99) holds
    assert 0 < decoded["rel_err"] < 0.1 and decoded["cosine"] > 0.99
    refused = subprocess.run(["kopt", "explain", "flux2", "--fp8-attention"], capture_output=True, text=True,
                             timeout=300)
    assert refused.returncode != 0 and "needs --fp8" in refused.stderr


def test_cli_demo_eager_smoke():
    """The demo runs, and its summary's error is within what the default pipeline promises at most."""
    result = subprocess.run(["kopt", "demo", "--lower", "eager", "--models", "flux2"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "summary" in result.stdout and "flux2" in result.stdout
    (kopt_err, eager_err, vs_eager), = re.findall(
        r"flux2\s+vs reference: kopt rel_err (\S+) cos \S+, eager rel_err (\S+); kopt vs eager rel_err (\S+)",
        result.stdout)
    bound = Contract.exact()
    for rewrite in kopt.default_pipeline():
        bound = bound.combine(rewrite.contract)
    assert 0 <= float(vs_eager) <= bound.rel_tol
    assert 0 <= float(kopt_err) <= float(eager_err) + bound.rel_tol  # never further from float64 than promised


def test_custom_pass_example_runs():
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "custom_pass.py")], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "fuse-silu fired 1x" in result.stdout
    (error,) = re.findall(r"relative error (\S+)", result.stdout)
    (bound,) = re.findall(r"verify output 0: rel \S+ vs reference \(.*?bound (\S+) =", result.stdout)  # fired contracts
    assert float(error) <= float(bound) and "VIOLATION" not in result.stdout


def test_cli_rejects_unknown_passes_and_workloads_cleanly():
    """A typo gets one line naming the valid choices, not a traceback."""
    for argv, expected in ((["explain", "flux2", "--passes", "nope"], "unknown pass 'nope'"),
                           (["explain", "qwen"], "unknown workload 'qwen'")):
        result = subprocess.run(["kopt", *argv], capture_output=True, text=True, timeout=300)
        assert result.returncode != 0 and expected in result.stderr and "Traceback" not in result.stderr


def _subcommand(name: str) -> argparse.ArgumentParser:
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices[name]


def test_explain_and_demo_lower_as_kopt_compile_does_and_every_option_says_what_it_does():
    """Same default lowering as kopt.compile (Inductor); every option has help; the workload's help says
    what a module:factory must give."""
    default = inspect.signature(kopt.compile).parameters["lower"].default
    for name, argv in (("explain", ["explain", "flux2"]), ("demo", ["demo"])):
        assert build_parser().parse_args(argv).lower == Lowering(default).value == "inductor"
        options = [a for a in _subcommand(name)._actions if not isinstance(a, argparse._HelpAction)]
        undocumented = [a.dest for a in options if not a.help]
        assert not undocumented, f"kopt {name}: options without help: {undocumented}"
    (workload,) = [a for a in _subcommand("explain")._actions if a.dest == "workload"]
    assert "module:factory" in workload.help and "kopt.workloads.Workload" in workload.help


def test_explain_full_size_without_a_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: --size full would build the full model")
    result = subprocess.run(["kopt", "explain", "flux2", "--size", "full"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode != 0 and "needs a CUDA device" in result.stderr and "Traceback" not in result.stderr
