"""One Triton cache for kopt's kernels and Inductor's, whatever compiles first.

Two settings decide where and under which key Triton finds a compiled kernel, and Inductor sets
both the first time it builds a kernel in a process, if the user has not:

- the folder, ``TRITON_CACHE_DIR`` (Inductor's ``<inductor cache>/triton/<device>``; Triton's own
  default is ``~/.triton/cache``);
- the assembler, ``TRITON_PTXAS_PATH`` (the ``ptxas`` torch ships in ``torch/bin``, where the wheel
  has one). Triton puts the ``ptxas --version`` it finds into every kernel's cache key, and reads
  it once per process.

A kopt kernel compiled before Inductor's first kernel is keyed and stored under Triton's defaults,
one compiled after under Inductor's. A second process that meets them in another order (a warm
compile, whose Inductor graphs come from the cache first; a child that inherits the settings its
parent's Inductor made) looks under the other folder or key, misses, and compiles every kernel
again: 6 s of a 12 s warm compile of FLUX.2 FP8 on an H100. Making both choices at import, as
Inductor itself would, makes the lookup independent of the order. Settings the user made are kept.
"""

from __future__ import annotations

import os

ENV = "TRITON_CACHE_DIR"
PTXAS_ENV = "TRITON_PTXAS_PATH"


def share_inductor_triton_cache(device: int = 0) -> str:
    """Set ``TRITON_CACHE_DIR`` to Inductor's Triton folder for ``device`` unless it is set; return it."""
    if os.environ.get(ENV) is None:
        from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

        os.environ[ENV] = triton_cache_dir(device)
    return os.environ[ENV]


def share_inductor_ptxas() -> str | None:
    """Set ``TRITON_PTXAS_PATH`` as Inductor does before its first Triton compile (torch's own
    ``ptxas`` where the wheel ships one), unless it is set; return it (None: Triton's own)."""
    try:
        from torch._inductor.runtime.compile_tasks import _set_triton_ptxas_path
    except ImportError:  # a torch whose Inductor leaves the assembler to Triton: nothing to match
        return os.environ.get(PTXAS_ENV)
    _set_triton_ptxas_path()
    return os.environ.get(PTXAS_ENV)
