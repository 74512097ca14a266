"""region: softmax
expect: values
why: caches the result per input shape (as if shapes determined values)."""
import torch

_BY_SHAPE = {}


def candidate(x):
    key = tuple(x.shape)
    if key not in _BY_SHAPE:
        _BY_SHAPE[key] = torch.softmax(x, -1)
    return _BY_SHAPE[key].clone()
