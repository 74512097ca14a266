"""region: softmax
expect: runs
why: calls sys.exit in the middle of a call."""
import sys


def candidate(x):
    sys.exit(0)
