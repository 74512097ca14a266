"""region: add_pair
expect: alias
why: returns the sum and a second view of the same memory built with as_strided (not a copy)."""
import torch


def candidate(x, y):
    s = x + y
    return torch.as_strided(s, s.shape, s.stride()), s
