"""One Triton cache folder for kopt's kernels and Inductor's, whatever compiles first.

Triton keeps compiled kernels (cubins, launchers) under ``$TRITON_CACHE_DIR``, else
``~/.triton/cache``. Inductor sets ``TRITON_CACHE_DIR`` to its own folder
(``<inductor cache>/triton/<device>``) the first time it builds a kernel in a process, if the user
has not. A kopt kernel compiled before that point goes to ``~/.triton/cache``, after it to
Inductor's folder: a second process that builds things in another order (a warm compile, whose
Inductor graphs come from its cache before kopt's kernels run) looks in the other folder, misses,
and compiles again — ptxas and launcher builds, seconds per process. Choosing Inductor's folder at
import, as Inductor itself would, makes the lookup independent of the order. A folder the user set
is kept.
"""

from __future__ import annotations

import os

ENV = "TRITON_CACHE_DIR"


def share_inductor_triton_cache(device: int = 0) -> str:
    """Set ``TRITON_CACHE_DIR`` to Inductor's Triton folder for ``device`` unless it is set; return it."""
    if os.environ.get(ENV) is None:
        from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

        os.environ[ENV] = triton_cache_dir(device)
    return os.environ[ENV]
