"""region: gelu_bias
expect: process
why: never finishes importing."""
import time

time.sleep(10_000)


def candidate(b, x):
    return x
