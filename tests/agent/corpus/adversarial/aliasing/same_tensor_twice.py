"""region: add_pair
expect: alias
why: both outputs are equal in value, so it returns one tensor twice (the original's outputs never share memory)."""


def candidate(x, y):
    s = x + y
    return s, s
