"""fuse-qk-norm-rope-pair: Q's and K's norm + RoPE ops that share tables become one op; it pairs
within an attention, not across blocks, waits for no value computed later, and stays within
float32 rounding of the unpaired graph on real tiny DiTs."""

from __future__ import annotations

import pytest
import torch

from kopt.fx.capture import trace_function
from kopt.passes.fuse.qk_norm_rope_pair import FuseQKNormRopePair
from kopt.passes.manager import run_passes
from tests.conftest import compile_close_to_eager, rel_err

SINGLE = torch.ops.kopt.qk_norm_rope.default
PAIR = torch.ops.kopt.qk_norm_rope_pair.default


def _tables(s: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.rand(s, d, generator=torch.Generator().manual_seed(seed)) * 6.28
    return angles.cos(), angles.sin()


def _targets(graph_module: torch.fx.GraphModule) -> list[object]:
    return [n.target for n in graph_module.graph.nodes]


def test_q_and_k_on_one_table_become_one_op_with_their_own_weights():
    cos, sin = _tables(5, 8, 1)
    wq, wk = torch.rand(8) + 0.5, torch.rand(8) + 0.5

    def region(xq, xk):
        return SINGLE(xq, wq, cos, sin, 1e-6, "real") * 2, SINGLE(xk, wk, cos, sin, 1e-5, "real")

    graph_module = trace_function(region, torch.randn(2, 5, 3, 8), torch.randn(2, 5, 3, 8))
    (record,) = run_passes(graph_module, [FuseQKNormRopePair()], strict=True)
    assert record.matches == {"qk-norm-rope-pair": 1}
    assert _targets(graph_module).count(PAIR) == 1 and SINGLE not in _targets(graph_module)
    xq, xk = torch.randn(2, 5, 3, 8) * 3, torch.randn(2, 5, 3, 8) + 1
    for got, want in zip(graph_module(xq, xk), region(xq, xk), strict=True):
        assert rel_err(got, want) < 1e-6


def test_an_input_computed_after_q_is_moved_up_unless_it_reads_q():
    """K's input is ``(k * 2).view(...)`` traced after Q's op: both nodes move up; an input computed
    from Q's result (``q * 2``) keeps the ops apart."""
    cos, sin = _tables(4, 8, 2)

    def movable(xq, xk):
        q = SINGLE(xq, None, cos, sin, 1e-6, "real")
        return q, SINGLE((xk * 2).view(1, 4, 2, 8), None, cos, sin, 1e-6, "real")

    graph_module = trace_function(movable, torch.randn(1, 4, 2, 8), torch.randn(1, 4, 16))
    (record,) = run_passes(graph_module, [FuseQKNormRopePair()], strict=True)
    assert record.matches == {"qk-norm-rope-pair": 1}
    xq, xk = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 16)
    for got, want in zip(graph_module(xq, xk), movable(xq, xk), strict=True):
        assert rel_err(got, want) < 1e-6

    def dependent(xq):
        q = SINGLE(xq, None, cos, sin, 1e-6, "real")
        return SINGLE(q * 2, None, cos, sin, 1e-6, "real")

    graph_module = trace_function(dependent, torch.randn(1, 4, 2, 8))
    (record,) = run_passes(graph_module, [FuseQKNormRopePair()], strict=True)
    assert record.total_matches == 0
    assert "computed after the first op" in record.near_misses[0].reason


def test_other_tables_or_shapes_do_not_pair():
    cos, sin = _tables(4, 8, 3)
    cos2, sin2 = _tables(4, 8, 4)

    def region(xq, xk, xc):
        return (SINGLE(xq, None, cos, sin, 1e-6, "real"), SINGLE(xk, None, cos2, sin2, 1e-6, "real"),
                SINGLE(xc, None, cos[:2], sin[:2], 1e-6, "real"))

    graph_module = trace_function(region, torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 2, 2, 8))
    (record,) = run_passes(graph_module, [FuseQKNormRopePair()], strict=True)
    assert record.total_matches == 0 and _targets(graph_module).count(SINGLE) == 3
    assert {m.reason for m in record.near_misses} == {
        "no other op rotates by the same tables: nothing to pair with"}


@pytest.mark.parametrize("name, pairs", [("ltx-video", 1), ("flux2", 1)])
def test_fires_on_tiny_dits_and_stays_close_to_eager(name, pairs):
    """LTX-Video's self-attention (heads flattened, one (S, H*D) table) and FLUX.2's single-stream
    block (its double-stream block's Q/K are joint ops, left alone)."""
    compiled = compile_close_to_eager(name, 1e-5, seed=5, dtype=torch.float32, passes="auto")
    assert compiled.kopt_report.matches("fuse-qk-norm-rope-pair") >= pairs


def test_pairs_within_each_block_of_a_whole_model(monkeypatch):
    """Two LTX-Video blocks compiled as one graph: every op rotates by the same tables, yet block 2's
    Q depends on block 1's K, so each block's Q pairs with its own K (2 pairs, no op left alone)."""
    import kopt
    from kopt.workloads import ltx_video

    monkeypatch.setitem(ltx_video.TINY, "num_layers", 2)
    torch.manual_seed(0)
    model = ltx_video.build_model("tiny").eval()
    inputs = ltx_video.WORKLOAD.inputs("tiny", seed=8, dtype=torch.float32)
    compiled = kopt.compile(model, passes="auto", lower="eager")
    with torch.no_grad():
        got, want = compiled(**inputs)[0], model(**inputs)[0]
    assert rel_err(got, want) < 1e-5
    (record,) = compiled.kopt_report.pass_records("fuse-qk-norm-rope-pair")
    assert record.matches == {"qk-norm-rope-pair": 2} and record.near_misses == []
