"""Regions cut from real models: the same chain in two different DiTs has one signature."""

from __future__ import annotations

import operator

import pytest
import torch

import kopt
from kopt.agent import region as regions

diffusers = pytest.importorskip("diffusers")
aten = torch.ops.aten


class _Spy(kopt.Pass):
    """Keeps the captured graphs; rewrites nothing."""

    name, why, contract = "spy", "test helper", kopt.Contract.exact()

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def apply(self, graph_module, ctx) -> None:
        self.graphs.append(graph_module)


def _captured(model, inputs) -> list[torch.fx.GraphModule]:
    spy = _Spy()
    compiled = kopt.compile(model, passes=[spy], lower="eager")
    with torch.no_grad():
        compiled(**inputs)
    return spy.graphs


def _norm_modulate_chains(graph_module, model: str) -> list[regions.Region]:
    """Each ``layer_norm(x) * (1 + scale) + shift`` without affine weights, cut out by what it computes."""
    found = []
    for node in graph_module.graph.nodes:
        if node.target is not aten.native_layer_norm.default or node.args[2] is not None:
            continue
        normed = next((u for u in node.users if u.target is operator.getitem and u.args[1] == 0), None)
        scaled = next((u for u in normed.users if u.target is aten.mul.Tensor), None) if normed else None
        shifted = next((u for u in scaled.users if u.target is aten.add.Tensor), None) if scaled else None
        if shifted is None:
            continue
        one_plus = next(a for a in scaled.args if a is not normed)
        if one_plus.target is not aten.add.Tensor or 1 not in one_plus.args:
            continue
        found.append(regions.extract(graph_module, [one_plus, node, normed, scaled, shifted], [shifted], model=model))
    return found


def test_norm_modulate_of_flux1_and_wan_share_a_signature():
    """FLUX.1's and Wan's adaLN chains, captured from the real diffusers classes (random weights, 64
    image tokens of width 64 in both), key to the same signature and class key."""
    torch.manual_seed(0)
    flux = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 6, 6)).eval()
    flux_inputs = dict(hidden_states=torch.randn(1, 64, 16), encoder_hidden_states=torch.randn(1, 8, 32),
                       pooled_projections=torch.randn(1, 32), timestep=torch.tensor([0.5]),
                       img_ids=torch.zeros(64, 3), txt_ids=torch.zeros(8, 3), return_dict=False)
    wan = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=16, in_channels=4, out_channels=4,
        text_dim=32, freq_dim=32, ffn_dim=128, num_layers=1, rope_max_seq_len=32).eval()
    wan_inputs = dict(hidden_states=torch.randn(1, 4, 4, 8, 8), timestep=torch.tensor([500]),
                      encoder_hidden_states=torch.randn(1, 8, 32), return_dict=False)

    flux_chains = [r for g in _captured(flux, flux_inputs) for r in _norm_modulate_chains(g, "flux1")]
    wan_chains = [r for g in _captured(wan, wan_inputs) for r in _norm_modulate_chains(g, "wan")]
    assert flux_chains and wan_chains
    shared = {r.signature for r in flux_chains} & {r.signature for r in wan_chains}
    assert shared, "no norm+modulate signature in common"
    assert {r.class_key for r in flux_chains} & {r.class_key for r in wan_chains}
    # FLUX.1 also modulates 8 text tokens and 72 joint tokens: other signatures, one class (the 64
    # image tokens equal the width, which couples two size symbols: another class key, by design)
    tokens = {r.text.exact.splitlines()[2]: r for r in flux_chains}
    assert {"in2: f32[1, 8, 64]", "in2: f32[1, 72, 64]"} <= set(tokens)
    text, joint = tokens["in2: f32[1, 8, 64]"], tokens["in2: f32[1, 72, 64]"]
    assert text.signature != joint.signature and text.class_key == joint.class_key
