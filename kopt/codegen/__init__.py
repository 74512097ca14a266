"""kopt.codegen: fused FX regions → Triton source → registered torch ops.

    region = kopt.codegen.build_region(nodes)          # or a reason string: why not
    generated = kopt.codegen.compile_region(region)     # .source, .op, .key, .path
    outputs = generated.op(*[the region's input tensors])

One concept per file: :mod:`~kopt.codegen.region` (what is fusible, from :mod:`~kopt.codegen.ir`'s
graph-free form and :mod:`~kopt.codegen.normalize`'s node-to-step rules), :mod:`~kopt.codegen.search`
(maximal regions in a graph), :mod:`~kopt.codegen.ops` (the op vocabulary in Triton and torch),
:mod:`~kopt.codegen.triton_source` (source text), :mod:`~kopt.codegen.cache` (disk and in-process
cache), :mod:`~kopt.codegen.op` (the torch op). The ``codegen-fuse`` pass applies it to graphs.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterable
from pathlib import Path

import torch

from kopt.codegen import cache
from kopt.codegen.op import op_name, register
from kopt.codegen.region import Region, build_region
from kopt.codegen.search import Search, find_regions
from kopt.codegen.triton_source import generate
from kopt.config import CompileOptions

__all__ = ["GeneratedOp", "Region", "Search", "build_region", "compile_region", "find_regions", "generate"]


@dataclasses.dataclass(frozen=True)
class GeneratedOp:
    """A region compiled to a torch op.

    Attributes:
        key: content key (source code, Triton version, GPU); equal regions share it.
        name: the op's name, ``gen_<key>`` in the ``kopt`` namespace.
        source: this region's generated module (its comments name this region's FX nodes).
        path: the cached module file (written by the first region with this key).
        module: the imported module (``reference``, the kernel, ``launch``).
        op: ``torch.ops.kopt.gen_<key>.default``; returns a tensor, or a tuple for several outputs.
        region: what it computes.
    """

    key: str
    name: str
    source: str
    path: Path
    module: types.ModuleType
    op: torch._ops.OpOverload
    region: Region


def compile_region(region: Region | Iterable[torch.fx.Node], *, trace_dir: Path | None = None) -> GeneratedOp:
    """Generate, cache and register the kernel for ``region`` (a Region, or FX nodes to build one).

    When ``trace_dir`` is given, or ``KOPT_DEBUG`` sets one, the source is also written to
    ``trace_dir/codegen/<name>.py``. Raises ValueError with the reason when the nodes are no region.
    """
    if not isinstance(region, Region):
        built = build_region(region)
        if isinstance(built, str):
            raise ValueError(f"not a fusible region: {built}")
        region = built
    source = generate(region)
    key, module, path = cache.load(source)
    op = register(key, module, len(region.inputs))
    name = op_name(key)
    trace_dir = trace_dir if trace_dir is not None else CompileOptions.from_environment().trace_dir
    if trace_dir is not None:
        folder = Path(trace_dir) / "codegen"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.py").write_text(source)
    return GeneratedOp(key, name, source, path, module, op, region)
