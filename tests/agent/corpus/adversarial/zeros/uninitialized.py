"""region: softmax
expect: values
why: returns torch.empty_like without writing it; the harness poisons the allocator with NaN first."""
import torch


def candidate(x):
    return torch.empty_like(x)
