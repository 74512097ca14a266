"""region: copy
expect: alias
why: returns x[:], a view sharing the input's memory."""


def candidate(x):
    return x[:]
