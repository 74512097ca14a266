"""region: silu_mul_bf16
expect: accept
why: silu spelled as a * sigmoid(a), every op in bfloat16 (one more rounding than the original)."""
import torch


def candidate(a, b):
    return a * torch.sigmoid(a) * b
