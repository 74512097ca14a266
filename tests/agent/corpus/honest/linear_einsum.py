"""region: linear_bias
expect: accept
why: the same contraction spelled as einsum."""
import torch


def candidate(b, x, w):
    return torch.einsum("mk,nk->mn", x, w) + b
