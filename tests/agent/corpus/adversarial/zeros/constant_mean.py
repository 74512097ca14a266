"""region: row_sum
expect: values
why: every row gets the same value, the mean row sum: right on average, wrong per row."""
import torch


def candidate(x):
    return torch.full(x.shape[:-1], x.sum().item() / max(x.shape[0], 1), dtype=x.dtype)
