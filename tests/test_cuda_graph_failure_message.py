"""Why a CUDA-graph recording failed names the op that failed, not only the capture's own error."""

from __future__ import annotations

from kopt.cuda_graphs import describe_failure


def _capture(op):
    try:  # what torch.cuda.graph's exit does when the body raised
        op()
    finally:
        raise RuntimeError("CUDA error: operation failed due to a previous error during capture")


def test_the_first_error_leads_and_the_capture_error_follows():
    def sync():
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")

    try:
        _capture(sync)
    except RuntimeError as error:
        text = describe_failure(error)
    assert text.startswith("RuntimeError: CUDA error: operation not permitted when stream is capturing (then ")
    assert "previous error during capture" in text and "more" not in text


def test_a_single_error_is_described_as_itself():
    assert describe_failure(ValueError("bad\nshape")) == "ValueError: bad"
