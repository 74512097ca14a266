"""A compiled block called with a fresh tensor and then with a slice of a wider one, which differ only
in the stride of a size-1 dimension, runs one graph (``kopt/unit_strides.py``)."""

from __future__ import annotations

import torch

from kopt.dynamo_cache import compile_fresh
from kopt.unit_strides import canonical_unit_strides, with_canonical_unit_strides


def test_a_slices_unit_stride_is_made_canonical_and_its_elements_kept():
    wide = torch.randn(1, 7, 5)
    tokens = wide[:, 3:]  # FLUX.1's single blocks: the image tokens of the concatenated sequence
    fresh = torch.randn(1, 4, 5)
    assert tokens.stride() != fresh.stride()
    canonical = canonical_unit_strides(tokens)
    assert canonical.stride() == fresh.stride()
    assert canonical.data_ptr() == tokens.data_ptr() and torch.equal(canonical, tokens)
    assert canonical_unit_strides(fresh) is fresh  # already canonical: itself, no view


def test_only_size_1_dimensions_change():
    wide = torch.randn(3, 1, 8)
    view = wide.transpose(0, 2)[:5]  # (5, 1, 3), strides (1, 8, 8): the size-1 stride addresses nothing
    canonical = canonical_unit_strides(view)
    assert canonical.stride()[0] == view.stride()[0] and canonical.stride()[2] == view.stride()[2]
    assert canonical.stride()[1] == view.stride()[2] * view.shape[2]
    assert torch.equal(canonical, view)
    batch2 = torch.randn(2, 7, 5)[:, 3:]  # no size-1 dimension: a real layout, kept
    assert canonical_unit_strides(batch2) is batch2


def test_a_fresh_tensor_and_a_slice_run_one_graph():
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def block(x: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.cat([x[:, :2] * scale, torch.sin(x)], dim=1)

    compiled = with_canonical_unit_strides(compile_fresh(block, "unit_strides", counting, fullgraph=True,
                                                         dynamic=False))
    x = torch.randn(1, 4, 6)
    first = compiled(x, 2.0)
    second = compiled(first[:, 2:], 2.0)  # the last 4 tokens of the 6: a slice, batch stride 36 against 24
    torch.testing.assert_close(second, block(first[:, 2:], 2.0))
    assert len(graphs) == 1

    graphs.clear()
    plain = compile_fresh(block, "strides_as_given", counting, fullgraph=True, dynamic=False)
    plain(x, 2.0)
    plain(plain(x, 2.0)[:, 2:], 2.0)
    assert len(graphs) == 2  # what dynamo does without it: the slice's batch stride fails a guard
