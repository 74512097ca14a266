"""region: relu
expect: late-write
why: writes every call into one module-level buffer per shape, so a later call overwrites what an earlier call
returned."""
import torch

_BUFFERS = {}


def candidate(x):
    out = _BUFFERS.setdefault((tuple(x.shape), x.dtype), torch.empty_like(x))
    return out.copy_(x.clamp_min(0))
