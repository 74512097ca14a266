"""region: relu
expect: mutation, alias
why: relu in place on the input."""


def candidate(x):
    return x.clamp_(min=0)
