"""region: rms_norm_modulate
expect: dtype
why: computes in float32, returns float16."""
import torch


def candidate(shift, w, x, scale):
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w * (1 + scale) + shift).half()
