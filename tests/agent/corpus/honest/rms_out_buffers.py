"""region: rms_norm_modulate
expect: accept
convention: out
why: writes into the provided buffer with out= ops, no allocation of its own result."""
import torch


def candidate(shift, w, x, scale, out):
    (result,) = out
    inv = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.mul(x, inv, out=result)
    result.mul_(w).mul_(1 + scale).add_(shift)
