"""The installed entry points: ``torch.compile(backend="kopt")`` without importing kopt, and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, timeout: int = 600) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=timeout, cwd="/")
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
    """options={...} takes kopt.compile's keywords (here: eager lowering, verification)."""
    out = _run("""
        import torch
        from kopt.workloads import get_workload
        w = get_workload("flux2")
        model, inputs = w.model("tiny"), w.inputs("tiny", seed=3)
        compiled = torch.compile(model, backend="kopt", options={"lower": "eager", "verify": True})
        with torch.no_grad():
            ref, out = model(**inputs)[0], compiled(**inputs)[0]
        import kopt
        graph = kopt.last_backend_report().graphs[0]
        print(torch.equal(ref, out), graph.lowering, graph.verification[0]["rel_err_vs_eager"],
              graph.verification[0]["ok"])
    """)
    assert out.startswith("True eager 0.0 True"), out


def test_cli_passes_lists_the_pipeline():
    out = subprocess.run(["kopt", "passes"], capture_output=True, text=True, check=True).stdout
    assert "redundancy" in out and "[exact]" in out


def test_cli_explain_json():
    result = subprocess.run(["kopt", "explain", "qwen-image", "--json"], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    decoded = json.loads(result.stdout)
    # against the float64 reference: kopt (fp32, run as FX) is as close as eager is
    assert decoded["rel_err"] < 1e-5 and decoded["rel_err"] <= decoded["eager_rel_err"] + 1e-6
    assert decoded["report"]["graphs"][0]["passes"][0]["name"] == "redundancy"


def test_cli_explain_fp8_reports_the_fp8_passes_and_the_quality():
    result = subprocess.run(["kopt", "explain", "flux2", "--fp8", "row", "--fp8-attention", "--json"],
                            capture_output=True, text=True, timeout=600)
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
    result = subprocess.run(["kopt", "demo", "--lower", "eager", "--models", "flux2"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "summary" in result.stdout and "flux2" in result.stdout and "rel_err 0.00e+00" in result.stdout


def test_custom_pass_example_runs():
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "custom_pass.py")], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "fuse-silu fired 1x" in result.stdout


def test_cli_rejects_unknown_passes_and_workloads_cleanly():
    """A typo gets one line naming the valid choices, not a traceback."""
    for argv, expected in ((["explain", "flux2", "--passes", "nope"], "unknown pass 'nope'"),
                           (["explain", "qwen"], "unknown workload 'qwen'")):
        result = subprocess.run(["kopt", *argv], capture_output=True, text=True, timeout=300)
        assert result.returncode != 0 and expected in result.stderr and "Traceback" not in result.stderr
