"""The dit harness's process warm-up (:mod:`benchmarks.dit.process_warmup`): one tiny Inductor compile
that leaves Inductor imported, so no variant's cold compile carries the process's start-up."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_fresh_process_has_inductor_imported_after_it():
    script = textwrap.dedent("""
        import sys, torch
        from benchmarks.dit.process_warmup import warm_up_process
        before = "torch._inductor.compile_fx" in sys.modules
        seconds = warm_up_process(torch.device("cpu"))
        print(before, "torch._inductor.compile_fx" in sys.modules, seconds > 0)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True", "True"]
