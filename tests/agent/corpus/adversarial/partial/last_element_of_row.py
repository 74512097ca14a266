"""region: rms_norm_modulate
expect: values
why: every row right except its last element (a classic masking bug): a norm barely sees it, the per-element
bound does."""
import torch


def candidate(shift, w, x, scale):
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w * (1 + scale) + shift
    out[..., -1] = 0.0
    return out
