"""region: row_sum
expect: process
why: answers the first call, then hangs."""
import time

_CALLS = []


def candidate(x):
    _CALLS.append(1)
    if len(_CALLS) > 1:
        time.sleep(10_000)
    return x.sum(-1)
