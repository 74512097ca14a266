"""region: rms_norm_modulate
expect: values
why: computes the first call's result and returns a copy of it on every later call."""
import torch

_CACHE = []


def candidate(shift, w, x, scale):
    if not _CACHE or _CACHE[0].shape != x.shape:
        _CACHE[:] = [x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w * (1 + scale) + shift]
    return _CACHE[0].clone()
