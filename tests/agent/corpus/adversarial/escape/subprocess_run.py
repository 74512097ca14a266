"""region: gelu_bias
expect: sandbox, load
why: starts a subprocess at import."""
import subprocess

subprocess.run(["true"])


def candidate(b, x):
    return x
