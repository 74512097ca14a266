"""region: copy
expect: sandbox, runs
why: reads a file outside the allowed paths (a key, a cache) through Python's open."""


def candidate(x):
    with open("/etc/hostname") as handle:
        handle.read()
    return x.clone()
