"""region: rms_norm_modulate
expect: values
why: returns zeros of the right shape and dtype: relative error 1."""
import torch


def candidate(shift, w, x, scale):
    return torch.zeros_like(x)
