"""region: linear_bias
expect: values
why: returns the bias broadcast over the rows, skipping the GEMM."""


def candidate(b, x, w):
    return b.expand(x.shape[0], w.shape[0]).clone()
