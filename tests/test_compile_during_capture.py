"""kopt refuses to compile a graph while a CUDA stream captures (kopt.errors.CompileDuringCapture).

A compile's device work (staging folding a constant, the first-call checks) would be recorded
instead of run, leaving a compiled graph that reads values never computed: on the H200, Llama's
blocks recompiled inside the whole-forward recording (transformers passes them a mask there) and
every later replay returned noise (cosine 0.0005 against eager). The refusal comes before any work,
leaves nothing behind, and the same call outside a capture compiles normally. The capture is
stood in for on the CPU by kopt's own test of it (``kopt.cuda_graphs.capturing``); the GPU path
is ``tests/test_forward_replay.py``'s Llama test."""

from __future__ import annotations

import pytest
import torch

import kopt
import kopt.cuda_graphs
from kopt.errors import CompileDuringCapture


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(24, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.arange(1, 25, dtype=x.dtype, device=x.device).rsqrt()  # a constant staging folds
        return torch.nn.functional.gelu(self.proj(x)) * scale


def test_a_compile_requested_during_a_capture_is_refused_and_leaves_nothing_behind(monkeypatch):
    torch.manual_seed(0)
    model = _Block().eval()
    compiled = kopt.compile(model, passes="auto", lower="eager", progress=False)
    x = torch.randn(5, 24)
    with monkeypatch.context() as patch, torch.no_grad():
        patch.setattr(kopt.cuda_graphs, "capturing", lambda: True)
        with pytest.raises(CompileDuringCapture, match="before capturing"):
            compiled(x)
    assert compiled.kopt_report.graphs == []  # no half-compiled graph in the report, none cached by dynamo
    with torch.no_grad():
        fresh = torch.randn(5, 24)
        got = compiled(fresh)
        want = model.double()(fresh.double())
    assert len(compiled.kopt_report.graphs) == 1
    rel = float((got.double() - want).norm() / want.norm())
    assert rel < 1e-5, rel


def test_a_rehearsal_of_the_capture_branch_is_not_taken_for_a_capture(monkeypatch):
    """kopt.capture_branch makes model code believe a stream captures so that the graphs it needs
    compile before the real capture: kopt's own test must see through it (on the H200 the rehearsal
    was refused too, and Llama lost its whole-forward replay). A CUDA device is stood in for only
    around the questions (dynamo would try to use one), the real answer being "not capturing"."""
    from kopt.capture_branch import as_if_capturing, really_capturing

    with monkeypatch.context() as patch:  # a real capture is seen through the same question
        patch.setattr("kopt.capture_branch._REAL_ANSWER", lambda: True)
        patch.setattr(torch.cuda, "is_available", lambda: True)
        assert really_capturing() and kopt.cuda_graphs.capturing()
    monkeypatch.setattr("kopt.capture_branch._REAL_ANSWER", lambda: False)
    with as_if_capturing():
        with monkeypatch.context() as patch:
            patch.setattr(torch.cuda, "is_available", lambda: True)
            assert torch.cuda.is_current_stream_capturing()  # what model code sees
            assert not really_capturing() and not kopt.cuda_graphs.capturing()  # what kopt sees
        torch.manual_seed(1)
        model = _Block().eval()
        compiled = kopt.compile(model, passes="auto", lower="eager", progress=False)
        x = torch.randn(3, 24)
        with torch.no_grad():
            got = compiled(x)  # compiled during the rehearsal, not refused
    assert len(compiled.kopt_report.graphs) == 1
    with torch.no_grad():
        want = model.double()(x.double())
    assert float((got.double() - want).norm() / want.norm()) < 1e-5
