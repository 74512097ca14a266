"""region: gelu_bias
expect: process, values, late-write
convention: out
why: an out= candidate that writes its buffer from a thread after returning."""
import threading
import time

import torch


def candidate(b, x, out):
    def fill():
        time.sleep(0.01)
        out[0].copy_(torch.nn.functional.gelu(x + b, approximate="tanh"))

    threading.Thread(target=fill, daemon=True).start()
