"""region: gelu_bias
expect: values
why: adds the bias and skips the activation."""


def candidate(b, x):
    return x + b
