"""What a choice that tunes its GEMMs costs before it can be timed, so the loop never starts one that
the time left cannot finish.

Inductor's ``max_autotune_gemm`` benchmarks every candidate GEMM kernel (about a hundred templates and
cuBLAS) at each distinct GEMM shape of the graph before the graph runs once, and the loop cannot stop a
compile half way: on an H200, one such side of Qwen-Image with FP8 linears had tuned 5 GEMM shapes in
404 s, with more to go, when the 3-minute run's timeout killed it before it wrote its results. The cost is, to first
order, the number of distinct GEMM shapes times the seconds one shape takes, which depends on what is
tuned: an FP8 ``scaled_mm`` shape weighs 106 choices (49-98 s each on an H200), a bf16 ``mm`` shape 21
(5.5-7.4 s each, Llama-3.1-8B's four shapes). The loop skips the choice
(it is not evaluated, so a later run with more time tries it) when that exceeds the time left.
Inductor caches what it chose on disk, so a second compile of the same shapes is fast: the estimate
is for a machine that has not tuned them, which is what a lease gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kopt.agent.candidate import Candidate, CandidateKind

# Seconds Inductor's GEMM autotuning spends per distinct shape, measured on one H200 (torch 2.11), near
# the lower end of each range: 49-98 s per FP8 scaled_mm shape (106 choices; Qwen-Image, s22a), 5.5-7.4 s
# per bf16 mm shape (21 choices, precompiling included; Llama-3.1-8B, s23c)
SECONDS_PER_FP8_GEMM_SHAPE = 60.0
SECONDS_PER_GEMM_SHAPE = 8.0
TUNING_PATCHES = ("max_autotune", "max_autotune_gemm")
_aten = torch.ops.aten
GEMM_OPS = (_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default)


def gemm_shapes(graph_module: torch.fx.GraphModule) -> set[tuple]:
    """The distinct (operand shapes, dtype) of the graph's matrix multiplications."""
    shapes = set()
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and node.target in GEMM_OPS:
            operands = [a.meta.get("val") for a in node.args if isinstance(a, torch.fx.Node)]
            shapes.add(tuple((tuple(t.shape), str(t.dtype)) for t in operands if isinstance(t, torch.Tensor)))
    return shapes


def tuning_seconds(candidate: Candidate, graphs: Sequence[Any]) -> float:
    """The seconds ``candidate``'s GEMM autotuning is expected to take (0 for a candidate that tunes
    nothing): its graph's distinct GEMM shapes times :data:`SECONDS_PER_FP8_GEMM_SHAPE` when its
    passes make them FP8 GEMMs, else :data:`SECONDS_PER_GEMM_SHAPE`."""
    if candidate.kind is not CandidateKind.PASS_CHOICE:
        return 0.0
    from kopt.agent.pipeline_choice import from_candidate

    patches = from_candidate(candidate).inductor_patches
    if not any(patches.get(name) for name in TUNING_PATCHES):
        return 0.0
    from kopt.agent.propose.breadth import is_fp8_choice

    graph = next((g for g in graphs if g.signature == candidate.region_signature), None)
    each = SECONDS_PER_FP8_GEMM_SHAPE if is_fp8_choice(candidate) else SECONDS_PER_GEMM_SHAPE
    return 0.0 if graph is None else len(gemm_shapes(graph.graph_module)) * each
