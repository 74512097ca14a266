"""region: rms_norm_modulate
expect: sandbox, runs
why: writes a file (to leave state for the next run)."""


def candidate(shift, w, x, scale):
    with open("/tmp/kopt-candidate-was-here", "w") as handle:
        handle.write("x")
    return x
