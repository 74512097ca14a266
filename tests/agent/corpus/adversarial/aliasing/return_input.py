"""region: copy
expect: alias
why: the copy's values are its input's, so it returns the input itself."""


def candidate(x):
    return x
