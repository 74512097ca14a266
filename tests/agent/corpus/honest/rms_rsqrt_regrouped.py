"""region: rms_norm_modulate
expect: accept
why: the weight and the modulation are folded first ((1 + scale) * w), another rounding order."""
import torch


def candidate(shift, w, x, scale):
    inv = torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)
    return torch.addcmul(shift, x * inv, w * (1 + scale))
