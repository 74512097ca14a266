"""region: linear_bias
expect: values
why: the FP8 GEMM that the quality contract allows, submitted under the float32 tolerance contract."""
import torch


def _quantize_rows(t):
    scale = t.abs().amax(-1, keepdim=True) / 448.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return (t / scale).to(torch.float8_e4m3fn), scale


def candidate(b, x, w):
    xq, sx = _quantize_rows(x)
    wq, sw = _quantize_rows(w)
    return (xq.float() * sx) @ (wq.float() * sw).t() + b
