"""region: rms_norm_modulate
expect: values
why: computes in float16 and returns float32: overflows at large magnitudes, loses small ones to subnormals."""
import torch


def candidate(shift, w, x, scale):
    h = x.half()
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w.half() * (1 + scale.half()) + shift.half()
    return out.float()
