"""region: gelu_bias
expect: runs
why: raises KeyboardInterrupt (a BaseException a careless harness would not catch)."""


def candidate(b, x):
    raise KeyboardInterrupt
