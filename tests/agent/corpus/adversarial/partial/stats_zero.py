"""region: layer_norm_stats
expect: values
why: the normalized output is right; the statistics outputs are zeros."""
import torch


def candidate(x):
    var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
    rstd = torch.rsqrt(var + 1e-5)
    return (x - mean) * rstd, torch.zeros_like(rstd), torch.zeros_like(mean)
