"""region: rms_norm_modulate
expect: mutation
why: normalizes x in place (saves an allocation) and returns a correct result computed from it."""
import torch


def candidate(shift, w, x, scale):
    x.mul_(torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    return x * w * (1 + scale) + shift
