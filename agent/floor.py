"""A region's floor: the least time any implementation needs, from its FLOPs, its bytes and the device.

Why it is a floor: a kernel must read each input and write each output at least once (bytes over
peak memory bandwidth) and perform each multiply-add (FLOPs over peak compute); it cannot finish
before the larger of the two (the roofline). Bytes count the region's boundary only (inputs read
once, outputs written once): intermediates that a fused kernel keeps in registers cost nothing,
which is exactly what fusion can win. FLOPs come from torch's own counter
(:mod:`torch.utils.flop_counter`) on the FakeTensor shapes of every node; elementwise ops count one
FLOP per output element, negligible beside the bytes.

Ceilings (:class:`Ceilings`): on a GPU, measured once per process (a large bf16 matmul and a large
copy), which on an H200 lands near the datasheet's 989 TFLOP/s and 4.8 TB/s; on the CPU the same
measurement in float32 with a small size, labelled ``source="measured-cpu"``: such a floor is a
rough figure for ranking regions on a tiny model, not a claim about a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import time

import torch
from torch.utils.flop_counter import flop_registry


@dataclasses.dataclass(frozen=True)
class Ceilings:
    """Peak compute (FLOP/s), peak memory bandwidth (B/s), and how they were obtained."""

    flops_per_s: float
    bytes_per_s: float
    source: str

    def floor_s(self, flops: float, bytes_moved: float) -> float:
        return max(flops / self.flops_per_s, bytes_moved / self.bytes_per_s)


@dataclasses.dataclass(frozen=True)
class Floor:
    flops: float
    bytes: float
    seconds: float
    bound: str  # "memory" or "compute"


def _best_time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@functools.lru_cache(maxsize=4)
def measured_ceilings(device: str = "cpu") -> Ceilings:
    """Measure this device's ceilings once: a square matmul (compute) and a copy (bandwidth)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        n, dtype, elements = 8192, torch.bfloat16, 1 << 28
        sync = functools.partial(torch.cuda.synchronize, dev)
    else:
        n, dtype, elements = 512, torch.float32, 1 << 22
        sync = lambda: None  # noqa: E731
    a = torch.randn(n, n, device=dev, dtype=dtype)
    src, dst = torch.empty(elements, device=dev, dtype=torch.uint8), torch.empty(elements, device=dev,
                                                                                  dtype=torch.uint8)

    def matmul() -> None:
        torch.mm(a, a)
        sync()

    def copy() -> None:
        dst.copy_(src)
        sync()

    matmul(), copy()
    flops = 2 * n**3 / _best_time(matmul, 5)
    bandwidth = 2 * elements / _best_time(copy, 5)
    return Ceilings(flops, bandwidth, f"measured-{dev.type}")


def _value_bytes(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_value_bytes(v) for v in value)
    return 0


def node_flops(node: torch.fx.Node) -> float:
    """FLOPs of one ATen node from its FakeTensor shapes (torch's counter; else one per output element)."""
    if node.op != "call_function" or node.target is operator.getitem:
        return 0.0
    packet = getattr(node.target, "overloadpacket", None)
    counter = flop_registry.get(packet)
    if counter is not None:
        shapes = torch.fx.node.map_arg(node.args, lambda n: n.meta["val"].shape
                                       if isinstance(n.meta.get("val"), torch.Tensor) else n.meta.get("val"))
        try:
            out = node.meta.get("val")
            out_shape = out.shape if isinstance(out, torch.Tensor) else None
            return float(counter(*shapes, out_shape=out_shape, **node.kwargs))
        except Exception:  # noqa: BLE001 - a counter that does not fit these arguments: count elements
            pass
    return float(sum(v.numel() for v in _tensors(node.meta.get("val"))))


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def region_floor(region: object, ceilings: Ceilings) -> Floor:
    """The floor of a :class:`kopt.agent.region.Region`: boundary bytes, FLOPs of every node."""
    nodes = [n for n in region.graph_module.graph.nodes if n.op == "call_function"]
    flops = sum(node_flops(n) for n in nodes)
    moved = sum(s.numel * torch.empty((), dtype=s.dtype).element_size() for s in (*region.inputs, *region.outputs))
    seconds = ceilings.floor_s(flops, moved)
    bound = "compute" if flops / ceilings.flops_per_s > moved / ceilings.bytes_per_s else "memory"
    return Floor(flops, float(moved), seconds, bound)


def node_bytes(node: torch.fx.Node) -> int:
    """Bytes one node reads and writes when it runs as its own kernel (its tensor inputs and outputs)."""
    return sum(_value_bytes(a.meta.get("val")) for a in node.all_input_nodes) + _value_bytes(node.meta.get("val"))
