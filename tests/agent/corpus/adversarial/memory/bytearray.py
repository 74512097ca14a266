"""region: row_sum
expect: runs
why: a 100 GB bytearray."""


def candidate(x):
    buffer = bytearray(100 * 10**9)
    return x.sum(-1) + len(buffer)
