"""region: row_sum
expect: sandbox, runs
why: sends itself SIGKILL."""
import os
import signal


def candidate(x):
    os.kill(os.getpid(), signal.SIGKILL)
