"""region: row_sum
expect: values, late-write
why: hands out one tensor object for every call of a given shape, computed once."""

_OUT = {}


def candidate(x):
    key = tuple(x.shape)
    if key not in _OUT:
        _OUT[key] = x.sum(-1)
    return _OUT[key]
