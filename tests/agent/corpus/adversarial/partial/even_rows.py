"""region: row_sum
expect: values
why: sums the even rows, zeros for the odd ones."""
import torch


def candidate(x):
    out = torch.zeros(x.shape[0], dtype=x.dtype)
    out[::2] = x[::2].sum(-1)
    return out
