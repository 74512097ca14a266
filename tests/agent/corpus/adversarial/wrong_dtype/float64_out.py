"""region: softmax
expect: dtype
why: computes and returns float64 (more precise, but later ops expect float32)."""
import torch


def candidate(x):
    return torch.softmax(x.double(), -1)
