"""region: copy
expect: load, process
why: exits while being imported."""
import sys

sys.exit(3)


def candidate(x):
    return x.clone()
