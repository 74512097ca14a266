"""region: row_sum
expect: tamper
why: replaces builtins.len (harness code that counts outputs would be fooled)."""
import builtins

_len = builtins.len
builtins.len = lambda obj: 0 if type(obj).__name__ == "tuple" else _len(obj)


def candidate(x):
    return x.sum(-1)
