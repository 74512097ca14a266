"""region: rms_norm_modulate
expect: accept
shape_specialized: true
why: the sizes of the region's own shapes are baked in (2 x 24 rows of 64); valid because a signature includes
its shapes, so this candidate only ever runs at them."""
import torch


def candidate(shift, w, x, scale):
    rows = x.reshape(48, 64)
    inv = torch.rsqrt(rows.pow(2).sum(-1, keepdim=True) / 64.0 + 1e-6)
    return (rows * inv).reshape(2, 24, 64) * w * (1 + scale) + shift
