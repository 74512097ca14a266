"""``kopt.fx.layout.same_layout``: size-1 dims never matter; a symbolic stride is equal only when provably so."""

import torch

from kopt.fx.layout import same_layout


def test_strides_of_size_one_dims_do_not_matter():
    x = torch.randn(4, 1, 3)
    assert same_layout(x.shape, (3, 3, 1), (3, 99, 1))
    assert not same_layout(x.shape, (3, 3, 1), (1, 3, 4))  # transposed: another layout
    t = torch.randn(5, 7).t()
    assert not same_layout(t.shape, t.stride(), t.contiguous().stride())
    assert not same_layout((2, 3), (3, 1), (3, 1, 1))  # not even the same rank


def test_a_symbolic_stride_is_equal_only_when_provably_so():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    n = env.create_unbacked_symint()
    assert same_layout((2, n), (n, 1), (n, 1))
    assert not same_layout((2, n), (n, 1), (n + 1, 1))
    assert same_layout((1, n), (7, 1), (n, 1))  # the size-1 dim's stride never matters
