"""region: softmax
expect: sandbox, runs, load
why: loads libc through ctypes (native code is outside any Python-level check)."""
import ctypes


def candidate(x):
    ctypes.CDLL(None).getpid()
    return x
