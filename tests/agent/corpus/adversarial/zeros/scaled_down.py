"""region: linear_bias_fp8
expect: values
why: the right direction at a thousandth of the size: cosine 1, relative error 0.999 (the quality contract's
relative bound catches what cosine alone would not)."""


def candidate(b, x, w):
    return (x @ w.t() + b) * 1e-3
