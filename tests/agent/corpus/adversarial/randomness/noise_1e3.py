"""region: rms_norm_modulate
expect: values
why: adds relative noise of 1e-3, a hundred times the contract."""
import torch


def candidate(shift, w, x, scale):
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w * (1 + scale) + shift
    return out * (1 + 1e-3 * torch.randn_like(out))
