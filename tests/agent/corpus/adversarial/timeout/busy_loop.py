"""region: rms_norm_modulate
expect: process
why: spins forever in Python."""


def candidate(shift, w, x, scale):
    while True:
        pass
