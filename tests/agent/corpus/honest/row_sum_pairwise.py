"""region: row_sum
expect: accept
why: pairwise (tree) summation: halve the row until one column is left."""
import torch


def candidate(x):
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        head = x[..., :half] + x[..., half:2 * half]
        x = torch.cat([head, x[..., 2 * half:]], dim=-1) if x.shape[-1] % 2 else head
    return x[..., 0].clone()
