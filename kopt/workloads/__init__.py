"""Built-in workloads (real diffusers classes, random weights) and user workloads by import path.

``get_workload("qwen-image")``, ``get_workload("flux2")`` or ``get_workload("my_pkg.models:make")``
where ``make()`` returns a :class:`Workload`.
"""

from __future__ import annotations

import importlib

from kopt.workloads.base import Size, Workload
from kopt.workloads.flux2 import WORKLOAD as FLUX2
from kopt.workloads.qwen_image import WORKLOAD as QWEN_IMAGE

BUILTIN: dict[str, Workload] = {w.name: w for w in (QWEN_IMAGE, FLUX2)}

__all__ = ["BUILTIN", "Size", "Workload", "get_workload"]


def get_workload(name: str) -> Workload:
    """Resolve a built-in name or a ``module:factory`` path to a :class:`Workload`."""
    if name in BUILTIN:
        return BUILTIN[name]
    if ":" not in name:
        raise KeyError(f"unknown workload {name!r}: use one of {sorted(BUILTIN)} or 'module:factory'")
    module_name, _, attr = name.partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    workload = factory() if callable(factory) and not isinstance(factory, Workload) else factory
    if not isinstance(workload, Workload):
        raise TypeError(f"{name} must be or return a kopt.workloads.Workload, got {type(workload).__name__}")
    return workload
