"""region: add_pair
expect: accept
why: the sum once, returned twice as two separate tensors (the original's two outputs never share memory)."""


def candidate(x, y):
    s = x + y
    return s.clone(), s
