"""region: rms_norm_modulate
expect: accept
why: computes in float64 and rounds once: more accurate than the original, never less."""
import torch


def candidate(shift, w, x, scale):
    x64 = x.double()
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double() * (1 + scale.double())
    return (y + shift.double()).float()
