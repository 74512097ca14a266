"""region: rms_norm_modulate
expect: strides
why: returns the result with the last two dims swapped in memory."""
import torch


def candidate(shift, w, x, scale):
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w * (1 + scale) + shift
    return out.transpose(1, 2).contiguous().transpose(1, 2)
