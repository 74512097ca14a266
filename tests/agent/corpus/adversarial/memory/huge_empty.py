"""region: rms_norm_modulate
expect: runs
why: asks for a terabyte."""
import torch


def candidate(shift, w, x, scale):
    scratch = torch.empty(1 << 40, dtype=torch.uint8)
    return x + scratch[0]
