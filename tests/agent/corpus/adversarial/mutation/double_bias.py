"""region: linear_bias
expect: mutation
why: doubles the bias in place and halves it back in the arithmetic: the output is right, the bias is not."""


def candidate(b, x, w):
    b.mul_(2.0)
    return x @ w.t() + b * 0.5
