"""region: rms_norm_modulate
expect: values
why: zeros wherever the result is not finite."""
import torch


def candidate(shift, w, x, scale):
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w * (1 + scale) + shift
    return torch.where(torch.isfinite(out), out, torch.zeros_like(out))
