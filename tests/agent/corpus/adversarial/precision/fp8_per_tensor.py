"""region: linear_bias_fp8
expect: values
why: FP8 with one scale for the whole activation tensor: rows of small magnitude lose their precision, and a NaN or
inf in one row spreads to every row."""
import torch


def candidate(b, x, w):
    sx = x.abs().amax().clamp_min(1e-30) / 448.0
    sw = w.abs().amax().clamp_min(1e-30) / 448.0
    xq = (x / sx).to(torch.float8_e4m3fn).float() * sx
    wq = (w / sw).to(torch.float8_e4m3fn).float() * sw
    return xq @ wq.t() + b
