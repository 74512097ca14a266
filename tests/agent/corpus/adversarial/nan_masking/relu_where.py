"""region: relu
expect: values
why: where(x > 0, x, 0) maps NaN to 0; relu keeps NaN."""
import torch


def candidate(x):
    return torch.where(x > 0, x, torch.zeros_like(x))
