"""region: gelu_bias
expect: values
why: functools.lru_cache keyed on the shapes returns the first result for a shape."""
import functools

import torch

_CURRENT = {}


@functools.lru_cache(maxsize=8)
def _compute(shape_x, shape_b):
    return torch.nn.functional.gelu(_CURRENT["x"] + _CURRENT["b"], approximate="tanh")


def candidate(b, x):
    _CURRENT["x"], _CURRENT["b"] = x, b
    return _compute(tuple(x.shape), tuple(b.shape)).clone()
