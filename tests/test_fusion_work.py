"""What Inductor would generate code for in a graph (:mod:`kopt.fx.fusion_work`), and the per-call stage
of a model's code between opaque blocks that runs as FX when that is nothing worth fusing."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kopt.fx.fusion_work import MAX_BYTES, FusionWork, fusion_work, nothing_to_fuse


def _pointwise(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    y = torch.nn.functional.linear(x, weight, bias).view(-1, x.shape[-1]).t()  # a GEMM and views: no code of its own
    return torch.nn.functional.silu(y) + 1.0  # two pointwise ops


def _captured(width: int, rows: int) -> torch.fx.GraphModule:
    args = (torch.randn(rows, width), torch.randn(width, width), torch.randn(width))
    return make_fx(_pointwise, tracing_mode="fake")(*args)


def test_only_the_ops_inductor_generates_code_for_are_counted_with_what_they_write():
    work = fusion_work(_captured(width=16, rows=8))
    assert work.ops == 2, work  # silu and add; not the GEMM, its bias, the view or the transpose
    assert work.bytes == 2 * 8 * 16 * 4
    assert nothing_to_fuse(work)


def test_a_stage_writing_much_or_many_ops_is_lowered():
    big = fusion_work(_captured(width=1024, rows=16384))
    assert big.bytes is not None and big.bytes > MAX_BYTES and not nothing_to_fuse(big)
    assert not nothing_to_fuse(FusionWork(ops=1000, bytes=1024))
    assert not nothing_to_fuse(FusionWork(ops=1, bytes=None))  # a symbolic size could be anything
