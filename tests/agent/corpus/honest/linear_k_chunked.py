"""region: linear_bias
expect: accept
why: the reduction over K accumulated in chunks of 17 (another summation order)."""


def candidate(b, x, w):
    acc = b.expand(x.shape[0], w.shape[0]).clone()
    for start in range(0, x.shape[1], 17):
        acc += x[:, start:start + 17] @ w[:, start:start + 17].t()
    return acc
