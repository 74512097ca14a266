"""Warming up a call the way its recording will run it: for code that branches on stream capture.

Some model code asks whether the current stream is capturing a CUDA graph and takes another path
if so: transformers' mask helpers (``is_tracing`` counts capturing) build a full causal mask under
capture instead of reading the padding mask on the host, so each decoder layer receives a mask
tensor where every plain call passed None. A recording of such a forward then runs code that no
warm-up ran: a compiled block sees an input it was never compiled for and recompiles while the
stream captures, which a capture refuses. :func:`as_if_capturing` makes
``torch.cuda.is_current_stream_capturing()`` answer True for one warm-up call, so that call takes
the capture branch and compiles and initialises what it needs outside the capture.

Valid because code that branches on capturing must compute the same result on both branches (the
capture branch also runs, for real, in every replay); the warm-up's outputs are only compared with
the first replay's. Used only for the recording that follows a failed one
(:class:`kopt.cuda_graphs.CudaGraphRunner`): a forward that records on its first try never takes it.
The answer is patched on the ``torch.cuda`` module for the duration of the call (process-wide,
like the capture it stands for).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_REAL_ANSWER = torch.cuda.is_current_stream_capturing


def really_capturing() -> bool:
    """Whether the current stream truly captures, whatever :func:`as_if_capturing` makes model code
    believe: kopt's own decisions (refusing to compile during a capture, deferring to an enclosing
    recording) must not take the rehearsal for the capture, or the rehearsal compiles nothing."""
    return torch.cuda.is_available() and _REAL_ANSWER()


@contextlib.contextmanager
def as_if_capturing() -> Iterator[None]:
    """Within the block, ``torch.cuda.is_current_stream_capturing()`` returns True."""
    original = torch.cuda.is_current_stream_capturing
    torch.cuda.is_current_stream_capturing = lambda: True
    try:
        yield
    finally:
        torch.cuda.is_current_stream_capturing = original
