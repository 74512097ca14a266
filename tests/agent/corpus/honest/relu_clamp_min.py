"""region: relu
expect: accept
why: relu is clamp_min(x, 0) (NaN stays NaN): bit-identical."""


def candidate(x):
    return x.clamp_min(0)
