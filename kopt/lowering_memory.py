"""Lowering checks that passed, remembered across processes, so a warm compile does not repeat them.

The lowering check (:mod:`kopt.checks`) runs the lowered graph, the same graph op by op and its
higher-precision reference on the first call, and compares them: on a 12B DiT a few seconds of a
warm compile that otherwise loads everything from caches. What it judges is the lowering of one
graph: the code Inductor and kopt's kernels produce for that graph text, those input shapes,
strides and dtypes, that device and those versions. When all of these are the same, the lowering
is the same code a check passed before, so the verdict carries over. The key holds each of them,
kopt's own source included (its version number does not change with every kernel edit); weights
are not in it: they are inputs to the same code. Only passes are remembered: a failed check runs
again, and ``KOPT_RECHECK_LOWERING=1`` checks every graph again.

Each verdict is a small JSON file under ``$KOPT_CACHE_DIR/lowering/`` (:mod:`kopt.cache_dir`),
written atomically, so concurrent processes never read half a file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

RECHECK_ENV = "KOPT_RECHECK_LOWERING"


def folder() -> Path:
    from kopt.cache_dir import kopt_cache_dir

    return kopt_cache_dir() / "lowering"


@functools.cache
def kopt_source_hash() -> str:
    """A hash of every Python file of the installed kopt package (kernels and passes included)."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        strides = tuple(value.stride()) if value.layout is torch.strided else str(value.layout)
        return f"T{tuple(value.shape)}{strides}{value.dtype}{value.device.type}"
    return type(value).__name__ if not isinstance(value, (int, float, bool, str, type(None))) else repr(value)


def verdict_key(graph_code: str, args: Sequence[Any], lowering: str, options: Mapping[str, Any]) -> str:
    """The key of a lowering: graph text, argument layouts, lowering and its options, device, versions."""
    import triton

    from kopt.version import __version__

    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    parts = [graph_code, "|".join(_describe(a) for a in args), lowering, json.dumps(dict(options), sort_keys=True,
             default=repr), device_name, torch.__version__, triton.__version__, __version__, kopt_source_hash(),
             os.environ.get("TRITON_INTERPRET", "0")]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def lowering_settings(mode: str, patches: Mapping[str, Any]) -> dict[str, Any]:
    """What else decides the lowered code: kopt's mode and Inductor patches, and Inductor's whole
    configuration as it stands (a caller's ``torch._inductor.config.patch`` included)."""
    import torch._inductor.config as inductor_config

    state = json.dumps(inductor_config.save_config_portable(), sort_keys=True, default=repr)
    return {"mode": mode, "patches": dict(patches), "inductor": hashlib.sha256(state.encode()).hexdigest()}


def remembered(key: str) -> dict[str, Any] | None:
    """The record of a check that passed under ``key``, or None (none, unreadable, or a recheck asked)."""
    if os.environ.get(RECHECK_ENV, "") not in ("", "0"):
        return None
    try:
        return json.loads((folder() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def remember(key: str, seconds: float, outputs: int) -> None:
    """Record that the check under ``key`` passed (best effort: a cache that cannot be written is skipped)."""
    from kopt.cache_dir import write_atomically

    record = {"passed_at": time.time(), "check_seconds": seconds, "outputs": outputs}
    try:
        write_atomically(folder() / f"{key}.json", json.dumps(record))
    except OSError:
        pass
