"""region: layer_norm_stats
expect: accept
why: Welford statistics merged over column chunks of 11 (Chan's parallel update), not two passes."""
import torch


def candidate(x):
    count = torch.zeros(x.shape[:-1] + (1,), dtype=x.dtype)
    mean = torch.zeros_like(count)
    m2 = torch.zeros_like(count)
    for start in range(0, x.shape[-1], 11):
        chunk = x[..., start:start + 11]
        n_b = chunk.shape[-1]
        mean_b = chunk.mean(-1, keepdim=True)
        m2_b = (chunk - mean_b).pow(2).sum(-1, keepdim=True)
        total = count + n_b
        delta = mean_b - mean
        mean = mean + delta * (n_b / total)
        m2 = m2 + m2_b + delta.pow(2) * (count * n_b / total)
        count = total
    rstd = torch.rsqrt(m2 / count + 1e-5)
    return (x - mean) * rstd, rstd, mean
