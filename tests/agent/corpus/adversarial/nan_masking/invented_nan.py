"""region: row_sum
expect: values
why: produces NaN for any row holding an exact zero, where the original's sum is finite."""
import torch


def candidate(x):
    s = x.sum(-1)
    return torch.where((x == 0).any(-1), torch.full_like(s, float("nan")), s)
