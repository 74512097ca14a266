"""region: rms_norm_modulate
expect: accept
why: 1 / sqrt instead of rsqrt, and the mean as a sum times 1/D."""
import torch


def candidate(shift, w, x, scale):
    mean_square = (x * x).sum(-1, keepdim=True) * (1.0 / x.shape[-1])
    return x / torch.sqrt(mean_square + 1e-6) * w * (scale + 1) + shift
