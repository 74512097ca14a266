"""region: rms_norm_modulate
expect: accept
why: rows in chunks of 7 (an awkward size), each chunk normalized on its own."""
import torch


def candidate(shift, w, x, scale):
    out = torch.empty_like(x)
    for b in range(x.shape[0]):
        for start in range(0, x.shape[1], 7):
            rows = x[b, start:start + 7]
            inv = torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + 1e-6)
            out[b, start:start + 7] = rows * inv * w * (1 + scale[b]) + shift[b]
    return out
