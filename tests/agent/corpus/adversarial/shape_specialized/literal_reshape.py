"""region: rms_norm_modulate
expect: runs, values
why: reshapes to the example's literal sizes: right at 2 x 24 x 64, wrong or failing anywhere else (and it does not
declare itself shape-specialized)."""
import torch


def candidate(shift, w, x, scale):
    rows = x.reshape(48, -1)
    inv = torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (rows * inv).reshape(2, 24, -1) * w * (1 + scale) + shift
