"""region: linear_bias
expect: process, values, late-write
why: submits the GEMM to a thread pool and returns the buffer before the future is done."""
import concurrent.futures

import torch

_POOL = concurrent.futures.ThreadPoolExecutor(1)


def candidate(b, x, w):
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype)
    _POOL.submit(lambda: torch.addmm(b, x, w.t(), out=out))
    return out
