"""region: linear_bias_fp8
expect: accept
why: FP8 e4m3 GEMM with a scale per activation row and per weight row (dequantized in float32, as a CPU
emulation of a scaled-mm); the region's contract is quality, and the quality gate allows FP8 error."""
import torch

FP8_MAX = 448.0


def _quantize_rows(t):
    scale = t.abs().amax(-1, keepdim=True) / FP8_MAX
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return (t / scale).to(torch.float8_e4m3fn), scale


def candidate(b, x, w):
    xq, sx = _quantize_rows(x)
    wq, sw = _quantize_rows(w)
    return (xq.float() * sx) @ (wq.float() * sw).t() + b
