"""region: linear_bias
expect: process
why: aborts the process (SIGABRT, no Python exception)."""
import os


def candidate(b, x, w):
    os.abort()
