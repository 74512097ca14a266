"""kopt's Triton kernels and Inductor's share one cache folder and one assembler (which is part of
every kernel's cache key) from ``import kopt`` on (``kopt/kernels/_triton_cache.py``), so a second
process finds kopt's compiled kernels whichever of the two compiles first."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = ("import os, kopt; from torch._inductor.runtime.cache_dir_utils import triton_cache_dir; "
         "print(os.environ.get('TRITON_CACHE_DIR')); print(triton_cache_dir(0))")
# what kopt chose for the assembler at import, and what Inductor's own rule chooses in a process without kopt
PTXAS_BY_KOPT = "import os, kopt; print(os.environ.get('TRITON_PTXAS_PATH'))"
PTXAS_BY_INDUCTOR = ("import os; from torch._inductor.runtime.compile_tasks import _set_triton_ptxas_path; "
                     "_set_triton_ptxas_path(); print(os.environ.get('TRITON_PTXAS_PATH'))")
SETTINGS = ("TRITON_CACHE_DIR", "TRITON_PTXAS_PATH")


def _run(code: str, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          timeout=300, check=True)
    return done.stdout.split()


def test_import_kopt_chooses_the_folder_inductor_would_choose(tmp_path):
    chosen, inductors = _run(PROBE, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    assert chosen == inductors == str(tmp_path / "inductor" / "triton" / "0")


def test_a_folder_the_user_set_is_kept(tmp_path):
    chosen, inductors = _run(PROBE, TRITON_CACHE_DIR=str(tmp_path / "mine"))
    assert chosen == inductors == str(tmp_path / "mine")


def test_import_kopt_chooses_the_assembler_inductor_would_choose():
    """torch's own ptxas where the wheel ships one (a CUDA wheel), Triton's ("None") where not."""
    (by_kopt,) = _run(PTXAS_BY_KOPT)
    (by_inductor,) = _run(PTXAS_BY_INDUCTOR)
    assert by_kopt == by_inductor


def test_an_assembler_the_user_set_is_kept(tmp_path):
    mine = tmp_path / "ptxas"
    mine.write_text("#!/bin/sh\n")
    mine.chmod(0o755)
    assert _run(PTXAS_BY_KOPT, TRITON_PTXAS_PATH=str(mine)) == [str(mine)]


def test_import_kopt_applies_inductors_rule_before_any_compile(tmp_path):
    """Where torch ships no ptxas (this CPU wheel) both choices above are Triton's own: here Inductor's
    rule is replaced, in the child, by one that picks a ptxas of the test's, before ``import kopt``;
    kopt's import must have applied it (doing nothing would leave the variable unset)."""
    mine = tmp_path / "ptxas"
    mine.write_text("#!/bin/sh\n")
    mine.chmod(0o755)
    code = ("import os; import torch._inductor.runtime.compile_tasks as tasks; "
            f"tasks._set_triton_ptxas_path = lambda: os.environ.setdefault('TRITON_PTXAS_PATH', {str(mine)!r}); "
            + PTXAS_BY_KOPT)
    assert _run(code) == [str(mine)]
