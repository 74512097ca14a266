"""region: layer_norm_stats
expect: values
convention: out
why: writes every row of the out= buffers except the last."""
import torch


def candidate(x, out):
    y, rstd, mean = out
    var, m = torch.var_mean(x[:-1], dim=-1, keepdim=True, correction=0)
    r = torch.rsqrt(var + 1e-5)
    y[:-1] = (x[:-1] - m) * r
    rstd[:-1] = r
    mean[:-1] = m
