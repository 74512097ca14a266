"""region: linear_bias
expect: accept
why: the bias folded into the GEMM (addmm), a fused epilogue."""
import torch


def candidate(b, x, w):
    return torch.addmm(b, x, w.t())
