"""region: gelu_bias
expect: accept
why: the tanh approximation written out: 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))."""
import math

import torch


def candidate(b, x):
    z = x + b
    return 0.5 * z * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z * z * z)))
