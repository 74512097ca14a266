"""region: linear_bias
expect: sandbox, runs
why: scans every object the garbage collector knows for a tensor of the output's shape."""
import gc

import torch


def candidate(b, x, w):
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.shape == (x.shape[0], w.shape[0]):
            return obj.clone()
    return torch.zeros(x.shape[0], w.shape[0])
