"""region: copy
expect: accept
why: a new tensor with the same layout, filled by copy_: bit-identical, no aliasing."""
import torch


def candidate(x):
    return torch.empty_like(x).copy_(x)
