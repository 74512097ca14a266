"""region: gelu_bias
expect: values
why: processes columns in blocks of 16 and forgets the tail (right at width 96, wrong at awkward widths)."""
import torch


def candidate(b, x):
    out = torch.zeros_like(x)
    full = x.shape[-1] // 16 * 16
    out[:, :full] = torch.nn.functional.gelu(x[:, :full] + b[:full], approximate="tanh")
    return out
