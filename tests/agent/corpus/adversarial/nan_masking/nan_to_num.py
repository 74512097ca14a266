"""region: softmax
expect: values
why: replaces NaN and inf in the output by finite numbers (the original has NaN rows for NaN inputs)."""
import torch


def candidate(x):
    return torch.nan_to_num(torch.softmax(x, -1))
