"""region: copy
expect: strides
why: a bit-identical copy laid out column-major."""


def candidate(x):
    return x.t().contiguous().t()
