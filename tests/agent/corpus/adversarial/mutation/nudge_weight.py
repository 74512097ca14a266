"""region: rms_norm_modulate
expect: mutation
why: rescales the weight by one ulp in place while computing: a tiny change, still a change to an input."""
import torch


def candidate(shift, w, x, scale):
    w.mul_(1.0000001)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w * (1 + scale) + shift
