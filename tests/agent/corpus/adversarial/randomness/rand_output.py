"""region: gelu_bias
expect: values
why: returns uniform noise of the right shape."""
import torch


def candidate(b, x):
    return torch.rand_like(x)
