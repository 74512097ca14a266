"""region: row_sum
expect: sandbox, runs
why: runs a shell command."""
import os


def candidate(x):
    os.system("echo hi")
    return x.sum(-1)
