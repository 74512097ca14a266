"""region: copy
expect: alias
why: returns a view of the input (same storage)."""


def candidate(x):
    return x.view_as(x)
