"""region: softmax
expect: values
why: writes every row but the last into a fresh tensor (the last keeps whatever the allocator gave)."""
import torch


def candidate(x):
    out = torch.empty_like(x)
    out[:-1] = torch.softmax(x[:-1], -1)
    return out
