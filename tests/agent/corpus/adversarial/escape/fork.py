"""region: linear_bias
expect: sandbox, runs
why: forks (a child could outlive the verifier)."""
import os


def candidate(b, x, w):
    if os.fork() == 0:
        os._exit(0)
    return x @ w.t() + b
