"""region: softmax
expect: mutation, alias
why: computes softmax into its input's memory and returns it."""
import torch


def candidate(x):
    x.copy_(torch.softmax(x, -1))
    return x
