"""Built-in workloads (real diffusers / transformers classes, random weights) and user workloads by import path.

``get_workload("qwen-image")``, ``get_workload("flux1")``, ... or ``get_workload("my_pkg.models:make")``
where ``make()`` returns a :class:`Workload`. The built-ins are the model zoo: Qwen-Image and FLUX.2
(the two kopt was tuned on), twelve more diffusers transformers (``DIFFUSERS``) and three
transformers LLM families (``LLMS``); each has its published configuration (``size="full"``) and a
tiny one of the same structure, with inputs built as its pipeline builds them.
"""

from __future__ import annotations

import importlib

from kopt.workloads import (
    chroma,
    cogvideox,
    flux1,
    flux2,
    hidream,
    hunyuan_video,
    llm,
    ltx_video,
    lumina2,
    mochi,
    pixart,
    qwen_image,
    sana,
    sd3,
    wan,
)
from kopt.workloads.base import Size, Workload

# diffusers transformers: the two kopt was tuned on, then the rest of the zoo
DIFFUSERS: tuple[Workload, ...] = (
    qwen_image.WORKLOAD, flux2.WORKLOAD, flux1.WORKLOAD, wan.WORKLOAD, sd3.WORKLOAD, cogvideox.WORKLOAD,
    ltx_video.WORKLOAD, hunyuan_video.WORKLOAD, sana.WORKLOAD, lumina2.WORKLOAD, pixart.WORKLOAD,
    chroma.WORKLOAD, hidream.WORKLOAD, mochi.WORKLOAD,
)
LLMS: tuple[Workload, ...] = llm.WORKLOADS
BUILTIN: dict[str, Workload] = {w.name: w for w in DIFFUSERS + LLMS}

__all__ = ["BUILTIN", "DIFFUSERS", "LLMS", "Size", "Workload", "get_workload"]


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
