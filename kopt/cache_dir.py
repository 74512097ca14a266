"""kopt's cache folder: ``$KOPT_CACHE_DIR``, else ``~/.cache/kopt``.

What lives there: launch configs the kernels' autotuner chose (``autotune.json``), generated kernels
(:mod:`kopt.codegen.cache`), lowering checks that passed (:mod:`kopt.lowering_memory`) and the
agent's default knowledge base (``kb.sqlite``).
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "KOPT_CACHE_DIR"


def kopt_cache_dir() -> Path:
    """``$KOPT_CACHE_DIR`` if set, else ``~/.cache/kopt`` (not created here)."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "kopt"
