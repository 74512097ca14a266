"""What Inductor would generate code for in a graph, and when that is too little to be worth lowering.

A model's code between its blocks, compiled with the blocks as ops (``between_blocks="compiled"``,
:mod:`kopt.opaque_blocks`), is mostly block calls, GEMMs and kopt's kernels; what remains for
Inductor's own kernels is a handful of pointwise ops on vectors (FLUX.1's per-call stage: two SiLUs
and three bias adds on ``[1, 3072]``). Lowering it costs seconds of a cold compile (FLUX.1 FP8 on an
H100: its graph lowered and checked in 12.3 s, 0.7 s run as FX), and buys at most what fusing those
ops saves: the memory traffic of what they write, and a launch per op when the stage is not replayed
from a CUDA graph.

:func:`fusion_work` counts that work: every op but views and ``getitem``, kopt's ops and the
ops Inductor hands to a library anyway (GEMMs, attention), as :func:`kopt.fx.graph_utils.op_kind`
sorts them for the report, with the bytes its outputs hold. :func:`nothing_to_fuse` holds when both
are small: at most :data:`MAX_OPS` ops writing at most :data:`MAX_BYTES`. FLUX.1 FP8's per-call stage at 1024² is 28 ops
writing 34 MiB, most of it the FP8 quantization of the 512 text tokens' states (float32 copies, absolute
values, scaled and clamped): fused, those bytes would not be written and read again, about 20 µs of an
H100's bandwidth per forward, and a launch per op saved where nothing replays the stage. At the limits
that bound is 40 µs (twice 64 MiB at 3.35 TB/s), against a forward that runs every block of the model.
Valid because running such a graph op by op computes what the verification already judged (the
rewritten graph op by op), and the time it can lose is bounded by those two numbers. A symbolic or
unrecorded size counts as large: the work could be anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kopt.fx.graph_utils import op_kind

MAX_OPS = 32
MAX_BYTES = 64 * 2**20
NO_CODE_OF_ITS_OWN = frozenset({"gemm", "attention", "view", "kopt"})  # kinds of kopt.fx.graph_utils.op_kind


@dataclass(frozen=True)
class FusionWork:
    """The ops Inductor would generate kernels for, and the bytes they write (None: a symbolic size)."""

    ops: int
    bytes: int | None

    def describe(self) -> str:
        written = "a symbolic size" if self.bytes is None else f"{self.bytes / 2**10:,.1f} KiB"
        return f"{self.ops} ops writing {written}"


def _generates_code(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    target = node.target
    if isinstance(target, torch._ops.OpOverload) and target.namespace == "kopt":
        return False  # before op_kind: it calls a kopt norm kernel "norm"
    return op_kind(node) not in NO_CODE_OF_ITS_OWN


def _bytes(value: object) -> int | None:
    if isinstance(value, torch.Tensor):
        if any(isinstance(s, torch.SymInt) for s in value.shape):
            return None
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        total = 0
        for item in value:
            size = _bytes(item)
            if size is None:
                return None
            total += size
        return total
    return 0


def fusion_work(graph_module: torch.fx.GraphModule) -> FusionWork:
    """The ops of ``graph_module`` Inductor would generate code for and what they write (module docstring)."""
    ops, written = 0, 0
    for node in graph_module.graph.nodes:
        if not _generates_code(node):
            continue
        ops += 1
        size = _bytes(node.meta["val"]) if "val" in node.meta else None
        if size is None or written is None:
            written = None
        else:
            written += size
    return FusionWork(ops, written)


def nothing_to_fuse(work: FusionWork) -> bool:
    """Whether ``work`` is too little for lowering to pay (module docstring)."""
    return work.ops <= MAX_OPS and work.bytes is not None and work.bytes <= MAX_BYTES
