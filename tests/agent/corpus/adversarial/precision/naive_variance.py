"""region: layer_norm_stats
expect: values
why: variance as E[x^2] - E[x]^2: cancels catastrophically when the mean is large against the spread."""
import torch


def candidate(x):
    mean = x.mean(-1, keepdim=True)
    var = (x * x).mean(-1, keepdim=True) - mean * mean
    rstd = torch.rsqrt(var + 1e-5)
    return (x - mean) * rstd, rstd, mean
