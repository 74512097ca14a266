"""region: linear_bias
expect: tamper
why: makes torch.cuda.synchronize a no-op, so a GPU timer would stop before queued work finished."""
import torch

torch.cuda.synchronize = lambda *args, **kwargs: None


def candidate(b, x, w):
    return torch.addmm(b, x, w.t())
