"""region: copy
expect: runs, values
why: maps the harness's output file with torch.from_file (C code: invisible to a Python audit hook, refused by
Landlock in the kernel)."""
import os

import torch


def candidate(x):
    folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    data = torch.from_file(os.path.join(folder, "snap.bin"), shared=False, size=x.numel(), dtype=x.dtype)
    return data.reshape(x.shape).clone()
