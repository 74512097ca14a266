"""region: layer_norm_stats
expect: values
convention: out
why: an out= candidate that writes nothing: the buffers keep their NaN poison."""


def candidate(x, out):
    return None
