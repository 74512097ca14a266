"""region: softmax
expect: accept
why: exp(t) = exp2(t * log2(e)); the row max is subtracted first as in the original."""
import math

import torch


def candidate(x):
    shifted = (x - x.amax(-1, keepdim=True)) * math.log2(math.e)
    e = torch.exp2(shifted)
    return e / e.sum(-1, keepdim=True)
