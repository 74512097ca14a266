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


def key_parts(graph_code: str, args: Sequence[Any], lowering: str, options: Mapping[str, Any]) -> dict[str, str]:
    """What decides a lowering, part by part (graph text, argument layouts, lowering and its options,
    device, versions, kopt's source), each as a short hash: :func:`verdict_key` joins them, and a record
    keeps them so that a miss can say which part changed (:func:`why_not_remembered`)."""
    import triton

    from kopt.version import __version__

    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    parts = {"graph": graph_code, "arguments": "|".join(_describe(a) for a in args), "lowering": lowering,
             "options": json.dumps(dict(options), sort_keys=True, default=repr), "device": device_name,
             "versions": "\0".join((torch.__version__, triton.__version__, __version__)),
             "kopt source": kopt_source_hash(), "interpreter": os.environ.get("TRITON_INTERPRET", "0")}
    return {name: hashlib.sha256(text.encode()).hexdigest()[:16] for name, text in parts.items()}


def verdict_key(graph_code: str, args: Sequence[Any], lowering: str, options: Mapping[str, Any]) -> str:
    """The key of a lowering: graph text, argument layouts, lowering and its options, device, versions."""
    return key_of(key_parts(graph_code, args, lowering, options))


def key_of(parts: Mapping[str, str]) -> str:
    """The file name of a verdict with these :func:`key_parts`."""
    return hashlib.sha256("\0".join(f"{k}={v}" for k, v in sorted(parts.items())).encode()).hexdigest()


def lowering_settings(mode: str, patches: Mapping[str, Any]) -> dict[str, Any]:
    """What else decides the lowered code: kopt's mode and Inductor patches, and Inductor's whole
    configuration as it stands (a caller's ``torch._inductor.config.patch`` included)."""
    import torch._inductor.config as inductor_config

    state = json.dumps(inductor_config.save_config_portable(), sort_keys=True, default=repr)
    return {"mode": mode, "patches": dict(patches), "inductor": hashlib.sha256(state.encode()).hexdigest()}


def rechecking() -> bool:
    """Whether ``KOPT_RECHECK_LOWERING`` asks for every graph to be checked again."""
    return os.environ.get(RECHECK_ENV, "") not in ("", "0")


def remembered(key: str) -> dict[str, Any] | None:
    """The record of a check that passed under ``key``, or None (none, unreadable, or a recheck asked)."""
    if rechecking():
        return None
    try:
        return json.loads((folder() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def remember(key: str, seconds: float, outputs: int, parts: Mapping[str, str] | None = None) -> None:
    """Record that the check under ``key`` passed (best effort: a cache that cannot be written is skipped)."""
    from kopt.cache_dir import write_atomically

    record = {"passed_at": time.time(), "check_seconds": seconds, "outputs": outputs, "parts": dict(parts or {})}
    try:
        write_atomically(folder() / f"{key}.json", json.dumps(record))
    except OSError:
        pass


def why_not_remembered(parts: Mapping[str, str]) -> str | None:
    """For a graph checked again: which parts of its key differ from the most recent remembered check of
    the same graph text (e.g. "arguments, options"), or None when no check of this graph text passed
    before. Read only on a miss; what a warm compile that re-checks a graph says about why."""
    newest: tuple[float, dict] | None = None
    try:
        files = list(folder().glob("*.json"))
    except OSError:
        return None
    for path in files:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        theirs = record.get("parts") or {}
        if theirs.get("graph") == parts.get("graph") and (newest is None or record["passed_at"] > newest[0]):
            newest = (record["passed_at"], theirs)
    if newest is None:
        return None
    return ", ".join(name for name in parts if newest[1].get(name) != parts[name]) or "none (the file was unreadable)"
