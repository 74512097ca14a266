"""region: silu_mul_bf16
expect: values
why: computes a bfloat16 region in float16: more mantissa, far less range (2^16 overflows)."""
import torch


def candidate(a, b):
    h = a.half()
    return (h * torch.sigmoid(h) * b.half()).bfloat16()
