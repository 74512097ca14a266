"""region: softmax
expect: values
why: computes in bfloat16 (8 bits of mantissa) under a float32 contract."""
import torch


def candidate(x):
    return torch.softmax(x.bfloat16(), -1).float()
