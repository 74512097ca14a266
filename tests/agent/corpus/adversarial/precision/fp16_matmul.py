"""region: linear_bias
expect: values
why: the GEMM in float16."""


def candidate(b, x, w):
    return (x.half() @ w.half().t()).float() + b
