"""region: rms_norm_modulate
expect: process
why: ends the process with os._exit(0) (a clean exit code, no report)."""
import os


def candidate(shift, w, x, scale):
    os._exit(0)
