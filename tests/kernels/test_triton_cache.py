"""kopt's Triton kernels and Inductor's share one cache folder from ``import kopt`` on
(``kopt/kernels/_triton_cache.py``), so a second process finds kopt's compiled kernels whichever
of the two compiles first."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = ("import os, kopt; from torch._inductor.runtime.cache_dir_utils import triton_cache_dir; "
         "print(os.environ.get('TRITON_CACHE_DIR')); print(triton_cache_dir(0))")


def _probe(**env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_DIR"}
    done = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True,
                          timeout=300, check=True)
    return done.stdout.split()


def test_import_kopt_chooses_the_folder_inductor_would_choose(tmp_path):
    chosen, inductors = _probe(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    assert chosen == inductors == str(tmp_path / "inductor" / "triton" / "0")


def test_a_folder_the_user_set_is_kept(tmp_path):
    chosen, inductors = _probe(TRITON_CACHE_DIR=str(tmp_path / "mine"))
    assert chosen == inductors == str(tmp_path / "mine")
