"""region: gelu_bias
expect: values
why: truncates inputs to 10 mantissa bits (TF32-like) before computing."""
import torch


def candidate(b, x):
    z = x + b
    truncated = (z.view(torch.int32) & ~0x1FFF).view(torch.float32)
    return torch.nn.functional.gelu(truncated, approximate="tanh")
