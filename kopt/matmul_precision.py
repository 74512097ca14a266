"""TF32 off for a block of code, and every float32 precision setting exactly as it was afterwards.

Why not ``allow_tf32 = False`` and back: each backend has an ``fp32_precision`` setting (torch 2.9
and later), and the legacy flags write it without undoing: ``torch.backends.cuda.matmul.allow_tf32 =
False`` moves it from "none" to "ieee", and setting the flag back leaves "ieee". Inductor keys its FX
graph cache by that setting, so a process that had computed kopt's reference once compiled every later
graph under another key than a fresh process would, and a second process (a restarted worker) found
none of the first's graphs in the cache. Reading a legacy flag also raises once a user has set the new
one. So only the new settings are read and written: each is saved, TF32 is turned off through them,
and each is written back, a parent before its children (a parent's write resets them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

# Parents before children: writing a parent's setting resets its children's.
_SETTINGS = ("", "cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn", "mkldnn", "mkldnn.matmul", "mkldnn.conv",
             "mkldnn.rnn")
# Where full precision is set: the GEMM and convolution backends (children follow their parent).
_FULL_PRECISION = ("cuda.matmul", "cudnn", "mkldnn")


def _backend(path: str) -> Any:
    backend: Any = torch.backends
    for part in path.split(".") if path else ():
        backend = getattr(backend, part)
    return backend


def precision_settings() -> dict[str, str]:
    """Every ``fp32_precision`` setting this torch has, by backend path ("" is the global one)."""
    settings = {}
    for path in _SETTINGS:
        try:
            value = _backend(path).fp32_precision
        except AttributeError:
            continue
        settings[path] = value
    return settings


def _restore(settings: dict[str, str]) -> None:
    for path, value in settings.items():
        if _backend(path).fp32_precision != value:
            _backend(path).fp32_precision = value


@contextlib.contextmanager
def full_precision_matmuls() -> Iterator[None]:
    """Matmuls and convolutions in full float32 precision (no TF32: 10 mantissa bits are no reference)
    inside the block; every precision setting as it was after it, even when the block raises."""
    settings = precision_settings()
    try:
        for path in _FULL_PRECISION:
            if path in settings:
                _backend(path).fp32_precision = "ieee"
        yield
    finally:
        _restore(settings)
