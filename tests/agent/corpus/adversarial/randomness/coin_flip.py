"""region: row_sum
expect: values
why: correct half of the time, the row mean the other half."""
import random


def candidate(x):
    return x.sum(-1) if random.random() < 0.5 else x.mean(-1)
