"""region: gelu_bias
expect: values
why: clamps the output to +-1e30, turning the original's inf into finite values."""
import torch


def candidate(b, x):
    return torch.nn.functional.gelu(x + b, approximate="tanh").clamp(-1e30, 1e30)
