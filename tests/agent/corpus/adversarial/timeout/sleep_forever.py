"""region: softmax
expect: process
why: sleeps instead of returning."""
import time


def candidate(x):
    time.sleep(10_000)
