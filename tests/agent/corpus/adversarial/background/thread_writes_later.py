"""region: rms_norm_modulate
expect: process, values, late-write
why: returns an empty tensor at once and fills it from a thread 10 ms later (a side-stream race on the CPU)."""
import threading
import time

import torch


def candidate(shift, w, x, scale):
    out = torch.empty_like(x)

    def fill():
        time.sleep(0.01)
        out.copy_(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w * (1 + scale) + shift)

    threading.Thread(target=fill).start()
    return out
