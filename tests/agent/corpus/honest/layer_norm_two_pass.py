"""region: layer_norm_stats
expect: accept
why: mean first, then the mean of squared deviations (two passes written out)."""
import torch


def candidate(x):
    mean = x.sum(-1, keepdim=True) / x.shape[-1]
    centered = x - mean
    var = (centered * centered).mean(-1, keepdim=True)
    rstd = 1.0 / torch.sqrt(var + 1e-5)
    return centered * rstd, rstd, mean
