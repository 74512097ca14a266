"""region: layer_norm_stats
expect: values
why: returns the input as the normalized output, with correct statistics."""
import torch


def candidate(x):
    var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
    return x.clone(), torch.rsqrt(var + 1e-5), mean
