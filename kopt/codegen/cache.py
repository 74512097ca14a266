"""Compile-and-load generated modules once: on disk by content key, and in this process.

The key is a SHA-256 of (the source without ``#`` comments, ``triton.__version__``, the GPU name or
``cpu-interpreter``). Comments only carry node names and traced shapes, so the key names exactly
the code that runs; the Triton version and GPU are in it because Triton's own binary cache (which
this sits in front of) compiles per version and target, and a module written by another version
must not be trusted. A module file starts with a stamp holding the SHA-256 of its body: a torn or
edited file fails the check and is written again, never imported. A second load of the same key in
one process returns the module already imported (no write, no import).

The folder is ``$KOPT_CACHE_DIR`` or ``~/.cache/kopt/codegen``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import re
import sys
import threading
import types
from pathlib import Path

import torch
import triton

from kopt.cache_dir import write_atomically

CACHE_ENV = "KOPT_CACHE_DIR"
_STAMP = "# kopt-codegen sha256="
_COMMENT = re.compile(r"\s*#.*$", re.MULTILINE)


@dataclasses.dataclass
class CacheStats:
    """Counters for tests and reports: files written, modules imported, in-process hits, repairs."""

    writes: int = 0
    imports: int = 0
    memory_hits: int = 0
    repairs: int = 0


STATS = CacheStats()
_MODULES: dict[str, types.ModuleType] = {}
_LOCK = threading.Lock()


def cache_dir() -> Path:
    """Where generated modules are stored (``$KOPT_CACHE_DIR`` or ``~/.cache/kopt/codegen``)."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "kopt" / "codegen"


def device_name() -> str:
    """The GPU the kernels compile for, or ``cpu-interpreter`` when Triton interprets on the CPU."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") or not torch.cuda.is_available():
        return "cpu-interpreter"
    return torch.cuda.get_device_name()


def code_only(source: str) -> str:
    """``source`` without comments and blank lines: what the key hashes."""
    return "\n".join(line for line in _COMMENT.sub("", source).splitlines() if line.strip())


def cache_key(source: str) -> str:
    """The content key of a generated module (24 hex digits of SHA-256)."""
    material = "\0".join((code_only(source), triton.__version__, device_name()))
    return hashlib.sha256(material.encode()).hexdigest()[:24]


def _digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def _intact(path: Path, source: str) -> bool:
    """Whether ``path`` holds a stamped module whose body is unharmed and has ``source``'s code."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return False
    stamp, _, body = text.partition("\n")
    return stamp == _STAMP + _digest(body) and code_only(body) == code_only(source)


def _write(path: Path, source: str) -> None:
    write_atomically(path, f"{_STAMP}{_digest(source)}\n{source}")  # a reader sees the old or the whole new
    STATS.writes += 1


def _import(key: str, path: Path) -> types.ModuleType:
    name = f"kopt_codegen_{key}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton.jit reads the kernel's source and globals through the module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    STATS.imports += 1
    return module


def load(source: str) -> tuple[str, types.ModuleType, Path]:
    """(key, module, path) for generated ``source``: from this process, else the disk, else written."""
    key = cache_key(source)
    path = cache_dir() / f"kopt_gen_{key}.py"
    with _LOCK:
        if key in _MODULES:
            STATS.memory_hits += 1
            return key, _MODULES[key], path
        if not _intact(path, source):
            if path.exists():
                STATS.repairs += 1
            _write(path, source)
        try:
            module = _import(key, path)
        except Exception:  # stamped and intact yet unimportable (e.g. written by a broken generator)
            STATS.repairs += 1
            _write(path, source)
            module = _import(key, path)
        _MODULES[key] = module
        return key, module, path


def forget_loaded() -> None:
    """Drop the in-process modules (the disk cache stays): the next load reads the disk again."""
    with _LOCK:
        _MODULES.clear()
