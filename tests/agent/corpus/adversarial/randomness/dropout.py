"""region: softmax
expect: values
why: zeroes 1% of the elements at random."""
import torch


def candidate(x):
    out = torch.softmax(x, -1)
    return out * (torch.rand_like(out) > 0.01)
