"""region: softmax
expect: process, values, late-write
why: a threading.Timer computes the result after the call returned."""
import threading

import torch


def candidate(x):
    out = torch.empty_like(x)
    threading.Timer(0.005, lambda: out.copy_(torch.softmax(x, -1))).start()
    return out
