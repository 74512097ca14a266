"""region: row_sum
expect: accept
why: the columns summed in reverse order, in float64, rounded once."""


def candidate(x):
    return x.flip(-1).double().sum(-1).to(x.dtype)
