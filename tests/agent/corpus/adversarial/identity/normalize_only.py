"""region: rms_norm_modulate
expect: values
why: normalizes and scales by the weight but skips the modulation (partial computation)."""
import torch


def candidate(shift, w, x, scale):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
