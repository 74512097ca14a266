"""Where a forward's time goes: profiler kernel time grouped into GEMM / attention / norm+elementwise /
copies / other, kernel launches per forward, and (CUDA) each forward's timeline: how long the host
ran before the first kernel started, and how long the GPU sat idle between kernels.

On CUDA every device-side event (kernels, memcpy, memset) is classified by its name with
:func:`classify`; ``launches`` counts those events per forward. On the CPU (the tiny smoke mode)
there are no kernels: each op's *self* CPU time is attributed to the category of its outermost
``aten::`` ancestor (so the ``copy_`` inside ``addmm`` counts as GEMM), and launches are None.
"""

from __future__ import annotations

import gzip
import shutil
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

CATEGORIES = ("gemm", "attention", "norm_elementwise", "copies", "other")
_MARK = "kopt_breakdown_forward_"

# Checked in this order; the first category with a matching (lower-case) substring wins.
# Inductor's matmul templates ("triton_tem_*") are GEMMs; every other Inductor kernel ("triton_poi_*",
# "triton_per_*", "triton_red_*") is fused norm/elementwise work even when its name mentions the op it
# feeds ("triton_poi_fused__scaled_dot_product_flash_attention_0" is a layout copy, not attention).
# Attention before GEMM because fused attention kernels also carry "cutlass"/"gemm" in their names;
# copies before elementwise because aten's copy/cast kernels are elementwise_kernel<direct_copy...>.
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gemm", ("triton_tem_",)),
    ("norm_elementwise", ("triton_",)),
    # kopt's own Triton kernels (kopt/kernels/*.py: "_<name>_kernel"; kopt/codegen: "kopt_gen_*")
    ("norm_elementwise", ("adaln_modulation", "gated_residual", "qk_norm_rope", "gelu_tanh", "swiglu",
                          "activation_quant", "kv_quant", "kopt_")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "attn")),
    ("gemm", ("gemm", "gemv", "cutlass", "xmma", "nvjet", "cublas", "scaled_mm", "f8f8bf16",
              "splitkreduce", "dot_kernel", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
              "aten::linear", "aten::matmul")),
    ("copies", ("copy", "memcpy", "memset", "catarray", "aten::cat", "concat", "aten::clone",
                "aten::contiguous", "aten::stack")),
    ("norm_elementwise", ("elementwise", "reduce", "norm", "softmax", "moments", "vectorized",
                          "unrolled", "aten::")),
)


def classify(name: str) -> str:
    """The category of a kernel (or CPU op) name; ``other`` when no rule matches.

    GEMM: gemm/gemv/cutlass/xmma/nvjet/cublas kernels, Inductor matmul templates, FP8 scaled_mm.
    attention: flash/fmha/attention/sdpa kernels. copies: copy/memcpy/memset/concatenation.
    norm_elementwise: Inductor's triton_ kernels, aten elementwise/reduce/norm/softmax kernels (and,
    on the CPU, any other aten op). other: everything else (e.g. CPU-side compiled-graph wrappers).
    """
    lowered = name.lower()
    for category, needles in RULES:
        if any(needle in lowered for needle in needles):
            return category
    return "other"


def _outermost_aten(event: Any) -> str:
    """Name of the outermost ``aten::`` op enclosing ``event`` (itself if none encloses it)."""
    name, parent = event.name, event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            name = parent.name
        parent = parent.cpu_parent
    return name


def _device_events(prof: profile) -> list[tuple[str, float, bool]]:
    """(name, microseconds, True) for every GPU-side event: kernels, memcpy, memset."""
    return [(e.name, e.time_range.elapsed_us(), True) for e in prof.events() if _is_device_work(e)]


def _is_device_work(event: Any) -> bool:
    """A kernel, memcpy or memset; not the GPU-side copy of a ``record_function`` range, which
    Kineto puts on the device timeline spanning the range's kernels."""
    return event.device_type == DeviceType.CUDA and not event.name.startswith(_MARK)


def _cpu_op_events(prof: profile) -> list[tuple[str, float, bool]]:
    """(outermost aten op, self microseconds, is that op itself) for every CPU event with self time."""
    events = []
    for e in prof.events():
        if e.device_type == DeviceType.CPU and e.self_cpu_time_total > 0 and not e.name.startswith(_MARK):
            owner = _outermost_aten(e)
            events.append((owner, e.self_cpu_time_total, owner == e.name))
    return events


def profile_breakdown(fn: Callable[[], Any], device: torch.device, forwards: int = 3,
                      top: int = 12, trace: Path | None = None) -> dict[str, Any]:
    """Profile ``forwards`` calls of ``fn`` (already warmed up) and summarise per forward.

    Returns ms per category, total kernel ms, launches per forward (CUDA only), and the ``top``
    kernels by time with their category, so a misclassified name is easy to spot in the JSON.
    ``trace``: also write the profile as a gzipped Chrome trace there (open it in Perfetto).
    """
    on_cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if on_cuda else [ProfilerActivity.CPU]
    if on_cuda:
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        for index in range(forwards):
            with record_function(f"{_MARK}{index}"):  # one synchronised forward per marker
                fn()
                if on_cuda:
                    torch.cuda.synchronize(device)
    if trace is not None:
        _write_trace(prof, trace)
    events = _device_events(prof) if on_cuda else _cpu_op_events(prof)
    per_category: dict[str, float] = {c: 0.0 for c in CATEGORIES}
    per_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for name, micros, is_call in events:
        per_category[classify(name)] += micros
        per_name[name][0] += micros
        per_name[name][1] += is_call
    scale = 1e-3 / forwards  # microseconds over all forwards -> ms per forward
    ranked = sorted(per_name.items(), key=lambda item: -item[1][0])[:top]
    return {
        "activity": "cuda kernels" if on_cuda else "cpu ops (self time, by outermost aten op)",
        "forwards_profiled": forwards,
        "ms": {c: round(v * scale, 4) for c, v in per_category.items()},
        "kernel_ms": round(sum(per_category.values()) * scale, 4),
        "launches": round(len(events) / forwards, 1) if on_cuda else None,
        "timeline": timeline(prof) if on_cuda else None,
        "top": [{"name": name[:160], "category": classify(name), "ms": round(t * scale, 4),
                 "calls_per_forward": round(n / forwards, 2)} for name, (t, n) in ranked],
    }


def _write_trace(prof: profile, path: Path) -> None:
    """The profile as a gzipped Chrome trace at ``path`` (``.json.gz``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    plain = path.with_suffix("")  # .json
    prof.export_chrome_trace(str(plain))
    with open(plain, "rb") as source, gzip.open(path, "wb") as target:
        shutil.copyfileobj(source, target)
    plain.unlink()


def timeline(prof: profile) -> dict[str, float] | None:
    """The forwards' timeline (see :func:`forward_timeline`) from a profile taken by
    :func:`profile_breakdown`, which marks each synchronised forward."""
    marks = [(e.time_range.start, e.time_range.end) for e in prof.events()
             if e.name.startswith(_MARK) and e.device_type == DeviceType.CPU]
    device = [(e.time_range.start, e.time_range.end) for e in prof.events() if _is_device_work(e)]
    return forward_timeline(marks, device)


def forward_timeline(forwards: list[tuple[float, float]], device: list[tuple[float, float]]
                     ) -> dict[str, float] | None:
    """Per synchronised forward ((start, end) on the profiler's common CPU/GPU clock, microseconds),
    averaged, in ms:

    * ``host_before_first_kernel``: from the call's start to the first device event's start (guards,
      Python dispatch, the step-invariant memo's key read, input copies into a CUDA graph);
    * ``idle_between_kernels``: the GPU's idle time between the first event's start and the last
      event's end (launch latency between dependent kernels, host stalls mid-forward);
    * ``busy``: the union of device events; ``span``: first start to last end.

    The profiler adds its own per-launch cost, so these attribute time; they are not the timed median."""
    device = sorted(device)
    sums = {"host_before_first_kernel": 0.0, "idle_between_kernels": 0.0, "busy": 0.0, "span": 0.0}
    counted = 0
    for start, stop in sorted(forwards):
        inside = [(a, b) for a, b in device if start <= a <= stop]
        if not inside:
            continue
        busy, end = 0.0, inside[0][0]
        for a, b in inside:  # union of intervals, sorted by start
            busy += max(0.0, b - max(a, end))
            end = max(end, b)
        span = end - inside[0][0]
        sums["host_before_first_kernel"] += inside[0][0] - start
        sums["idle_between_kernels"] += span - busy
        sums["busy"] += busy
        sums["span"] += span
        counted += 1
    if not counted:
        return None
    return {name: round(value / counted / 1e3, 4) for name, value in sums.items()}
