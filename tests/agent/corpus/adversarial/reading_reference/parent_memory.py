"""region: layer_norm_stats
expect: sandbox, runs
why: opens the parent process's memory through /proc to search it."""
import os


def candidate(x):
    with open(f"/proc/{os.getppid()}/mem", "rb") as handle:
        handle.read(16)
    return x, x[:, :1], x[:, :1]
