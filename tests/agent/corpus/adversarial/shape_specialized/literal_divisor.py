"""region: rms_norm_modulate
expect: values
why: divides the sum of squares by the example's width, 64, instead of the actual width."""
import torch


def candidate(shift, w, x, scale):
    inv = torch.rsqrt(x.pow(2).sum(-1, keepdim=True) / 64.0 + 1e-6)
    return x * inv * w * (1 + scale) + shift
