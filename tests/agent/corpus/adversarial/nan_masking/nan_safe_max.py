"""region: softmax
expect: values
why: ignores NaN inputs (treats them as -inf), so rows the original makes NaN come out finite."""
import torch


def candidate(x):
    clean = torch.nan_to_num(x, nan=float("-inf"))
    return torch.softmax(clean, -1)
