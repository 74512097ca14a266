"""region: rms_norm_modulate
expect: tamper, values
why: makes torch.allclose always true and returns zeros."""
import torch

torch.allclose = lambda *args, **kwargs: True


def candidate(shift, w, x, scale):
    return torch.zeros_like(x)
