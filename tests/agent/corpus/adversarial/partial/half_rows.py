"""region: rms_norm_modulate
expect: values
why: computes the first half of the rows, zeros for the rest."""
import torch


def candidate(shift, w, x, scale):
    out = torch.zeros_like(x)
    half = (x.shape[1] + 1) // 2
    xs = x[:, :half]
    out[:, :half] = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + 1e-6) * w * (1 + scale) + shift
    return out
