"""region: softmax
expect: strides
why: computes on the transposed input and returns a transposed view (column-major)."""
import torch


def candidate(x):
    return torch.softmax(x.t().contiguous(), 0).t()
