"""region: silu_mul_bf16
expect: dtype
why: returns the float32 result without rounding to the region's bfloat16."""
import torch


def candidate(a, b):
    return a.float() * torch.sigmoid(a.float()) * b.float()
