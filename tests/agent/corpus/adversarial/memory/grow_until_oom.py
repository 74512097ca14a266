"""region: softmax
expect: runs, process
why: keeps allocating 256 MiB blocks."""
import torch

_HOARD = []


def candidate(x):
    while True:
        _HOARD.append(torch.ones(64 << 20))
