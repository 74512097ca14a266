"""region: softmax
expect: values
why: returns a copy of its input unchanged."""


def candidate(x):
    return x.clone()
