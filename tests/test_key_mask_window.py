"""kopt.fx.match.key_mask_window: the keys where an attention mask may be nonzero, read from the graph
that builds it (Qwen-Image's joint text + image mask, masks built other ways, and masks it must not
claim to understand)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kopt.fx.match.key_mask_window import UNKNOWN, bias_window, key_runs

TEXT, IMAGE = 7, 64
NEG = float("-inf")


def _mask_node(build, *inputs):
    """The output node of ``build`` traced to ATen (with shapes on every node), and its key length."""
    graph_module = make_fx(build, tracing_mode="fake")(*inputs)
    (output,) = [n for n in graph_module.graph.nodes if n.op == "output"]
    node = output.args[0][0] if isinstance(output.args[0], (list, tuple)) else output.args[0]
    return node, node.meta["val"].shape[-1]


def _text_mask():
    return torch.rand(2, TEXT) > 0.3


def _joint(text_mask):  # diffusers' QwenDoubleStreamAttnProcessor2_0, then SDPA's bool -> additive form
    image = torch.ones(text_mask.shape[0], IMAGE, dtype=torch.bool)
    joint = torch.cat([text_mask, image], dim=1)[:, None, None, :]
    return torch.where(joint, torch.scalar_tensor(0.0), torch.scalar_tensor(NEG))


@pytest.mark.parametrize("build, window", [
    (_joint, (0, TEXT)),  # Qwen-Image: only the text keys can be masked
    (lambda m: torch.where(torch.cat([torch.ones(2, IMAGE, dtype=torch.bool), m], -1), 0.0, NEG),
     (IMAGE, IMAGE + TEXT)),  # image keys first
    (lambda m: torch.zeros(2, IMAGE + TEXT).masked_fill(~torch.cat([m, torch.ones(2, IMAGE, dtype=torch.bool)], 1),
                                                         NEG), (0, TEXT)),
    (lambda m: torch.where(torch.cat([m, m], -1), 0.0, NEG), (0, 2 * TEXT)),  # every key depends on the input
    (lambda m: torch.zeros(2, 1, 1, TEXT) + 0 * m[:, None, None, :], (0, TEXT)),  # arithmetic: not followed
    (lambda m: torch.cat([m, m], 0).float(), (0, TEXT)),  # cat along the batch: not the key dimension
    (lambda m: torch.where(torch.cat([m, torch.ones(2, IMAGE, dtype=torch.bool)], -1), 0.5, NEG),
     (0, TEXT + IMAGE)),  # the image keys' bias is a nonzero constant: they need it
    (lambda m: torch.zeros(2, 1, 1, IMAGE) + torch.zeros(1), (0, IMAGE)),  # zeros, but through an add
])
def test_window(build, window):
    node, keys = _mask_node(build, _text_mask())
    assert bias_window(node, keys) == window


def test_an_all_zero_mask_has_an_empty_window():
    node, keys = _mask_node(lambda m: torch.zeros(2, 1, 1, IMAGE), _text_mask())
    assert bias_window(node, keys) == (0, 0)


def test_a_view_merging_the_key_dimension_forgets_what_it_knew():
    node, keys = _mask_node(lambda m: torch.cat([m, torch.ones(2, IMAGE, dtype=torch.bool)], -1).reshape(-1).float(),
                            _text_mask())
    assert key_runs(node) == [(keys, UNKNOWN)]
    assert bias_window(node, keys) == (0, keys)


def test_no_mask_or_a_length_mismatch_means_every_key():
    node, keys = _mask_node(_joint, _text_mask())
    assert bias_window(None, 10) == (0, 10)
    assert bias_window(node, keys + 1) == (0, keys + 1)
