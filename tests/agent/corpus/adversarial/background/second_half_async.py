"""region: row_sum
expect: process, values, late-write
why: sums the first half of the rows, leaves the second half to a thread that finishes shortly after."""
import threading
import time

import torch


def candidate(x):
    out = torch.empty(x.shape[:-1], dtype=x.dtype)
    half = x.shape[0] // 2
    out[:half] = x[:half].sum(-1)

    def rest():
        time.sleep(0.002)
        out[half:] = x[half:].sum(-1)

    threading.Thread(target=rest).start()
    return out
