"""kopt's cache folder: ``$KOPT_CACHE_DIR``, else ``~/.cache/kopt``.

What lives there: launch configs the kernels' autotuner chose (``autotune.json``), generated kernels
(:mod:`kopt.codegen.cache`), lowering checks that passed (:mod:`kopt.lowering_memory`) and the
agent's default knowledge base (``kb.sqlite``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

CACHE_ENV = "KOPT_CACHE_DIR"


def kopt_cache_dir() -> Path:
    """``$KOPT_CACHE_DIR`` if set, else ``~/.cache/kopt`` (not created here)."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "kopt"


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``: a
    reader (another process sharing the cache) sees the old file or the whole new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
