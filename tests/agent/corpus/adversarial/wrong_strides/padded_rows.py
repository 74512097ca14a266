"""region: gelu_bias
expect: strides
why: writes into a buffer one column wider and returns the narrower view (row stride N + 1)."""
import torch


def candidate(b, x):
    buffer = torch.empty(x.shape[0], x.shape[1] + 1, dtype=x.dtype)
    out = buffer[:, : x.shape[1]]
    out.copy_(torch.nn.functional.gelu(x + b, approximate="tanh"))
    return out
