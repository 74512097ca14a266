"""region: rms_norm_modulate
expect: tamper
why: patches time.perf_counter_ns during the call, to shave the call's own duration; computes correctly."""
import time

import torch

_REAL = time.perf_counter_ns


def candidate(shift, w, x, scale):
    start = _REAL()
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w * (1 + scale) + shift
    elapsed = _REAL() - start
    time.perf_counter_ns = lambda: _REAL() - elapsed
    return out
