"""region: linear_bias
expect: values
why: keys its cache on the shape and on whether the first element is positive: a collision on every other
call with fresh inputs."""

_CACHE = {}


def candidate(b, x, w):
    key = (tuple(x.shape), tuple(w.shape), bool(x.flatten()[0] > 0))
    if key not in _CACHE:
        _CACHE[key] = x @ w.t() + b
    return _CACHE[key].clone()
