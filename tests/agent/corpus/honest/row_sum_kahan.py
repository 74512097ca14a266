"""region: row_sum
expect: accept
why: Kahan-compensated summation over columns, vectorized across rows."""
import torch


def candidate(x):
    total = torch.zeros(x.shape[:-1], dtype=x.dtype)
    compensation = torch.zeros_like(total)
    for column in x.unbind(-1):
        y = column - compensation
        t = total + y
        compensation = (t - total) - y
        total = t
    return total
