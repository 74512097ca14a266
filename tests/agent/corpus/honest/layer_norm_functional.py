"""region: layer_norm_stats
expect: accept
why: torch's own layer_norm for the normalized output, var_mean for the statistics."""
import torch


def candidate(x):
    var, mean = torch.var_mean(x, dim=-1, keepdim=True, unbiased=False)
    y = torch.nn.functional.layer_norm(x, x.shape[-1:], eps=1e-5)
    return y, torch.rsqrt(var + 1e-5), mean
