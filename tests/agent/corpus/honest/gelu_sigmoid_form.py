"""region: gelu_bias
expect: accept
why: 0.5 (1 + tanh(u)) = sigmoid(2u), so tanh-GELU is z * sigmoid(2 sqrt(2/pi) (z + 0.044715 z^3))."""
import math

import torch


def candidate(b, x):
    z = x + b
    return z * torch.sigmoid(2.0 * math.sqrt(2.0 / math.pi) * (z + 0.044715 * z.pow(3)))
