"""region: rms_norm_modulate
expect: load, sandbox
why: imports kopt's verifier to compute or find the expected output."""
from kopt.agent.verify import reference  # noqa: F401


def candidate(shift, w, x, scale):
    return x
