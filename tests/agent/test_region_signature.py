"""Region signatures: one key per computation on given shapes, whatever the way the region was built."""

from __future__ import annotations

import pytest
import torch

from kopt.agent import region as regions
from kopt.agent.region import TensorSpec
from kopt.config import Role


def _norm_modulate_with(eps):
    def norm_modulate(x, w, shift, scale):
        variance = x.pow(2).mean(-1, keepdim=True)
        normed = x * torch.rsqrt(variance + eps) * w
        return normed * (1 + scale) + shift
    return norm_modulate


_norm_modulate = _norm_modulate_with(1e-6)


def _norm_modulate_renamed_reordered(hidden, weight, shift_msa, scale_msa):
    """The same computation: other names, the independent ``1 + scale`` first, commuted products."""
    gate = 1 + scale_msa
    mean_square = hidden.pow(2).mean(-1, keepdim=True)
    return shift_msa + gate * (weight * (torch.rsqrt(mean_square + 1e-6) * hidden))


def _examples(b=2, s=8, d=16, dtype=torch.float32):
    return (torch.randn(b, s, d, dtype=dtype), torch.randn(d, dtype=dtype), torch.randn(b, 1, d, dtype=dtype),
            torch.randn(b, 1, d, dtype=dtype))


def test_names_order_and_commuted_operands_do_not_change_the_signature():
    """Different variable names, independent-op order and operand order of add/mul: one signature."""
    first = regions.from_function(_norm_modulate, *_examples())
    second = regions.from_function(_norm_modulate_renamed_reordered, *_examples())
    assert first.signature == second.signature and first.class_key == second.class_key
    assert first.text.exact == second.text.exact


def test_input_order_does_not_change_the_signature_and_inputs_come_out_canonical():
    """A function taking its inputs in another order gives the same region with the same input order."""
    def permuted(scale, shift, w, x):
        return _norm_modulate(x, w, shift, scale)

    x, w, shift, scale = _examples()
    first = regions.from_function(_norm_modulate, x, w, shift, scale)
    second = regions.from_function(permuted, scale, shift, w, x)
    assert first.signature == second.signature
    assert first.inputs == second.inputs


def test_extracted_from_a_bigger_graph_equals_traced_alone():
    """The chain cut out of a larger graph (names, neighbours, graph order all differ) keys the same."""
    from kopt.fx.capture import trace_function

    def bigger(a, x, w, shift, scale):
        noise = torch.relu(a) * 3.0
        out = _norm_modulate(x, w, shift, scale)
        return out + noise.sum(), noise

    a = torch.randn(4)
    graph_module = trace_function(bigger, a, *_examples())
    calls = [n for n in graph_module.graph.nodes if n.op == "call_function"]
    first = next(i for i, n in enumerate(calls) if n.target is torch.ops.aten.pow.Tensor_Scalar)
    output = next(n for n in graph_module.graph.nodes if n.op == "output")
    modulated = output.args[0][0].args[0]  # out + noise.sum(): its first operand is the chain's end
    chain = calls[first: calls.index(modulated) + 1]
    assert not any(n.target is torch.ops.aten.relu.default for n in chain)
    cut = regions.extract(graph_module, chain)
    alone = regions.from_function(_norm_modulate, *_examples())
    assert cut.signature == alone.signature
    assert [n.name for n in cut.output_nodes] == [chain[-1].name]


def test_swapping_two_inputs_of_the_same_spec_is_the_same_region():
    """shift and scale have one spec, so swapping them only renames inputs: the same canonical graph."""
    base = regions.from_function(_norm_modulate, *_examples())
    swapped = regions.from_function(lambda x, w, shift, scale: _norm_modulate(x, w, scale, shift), *_examples())
    assert swapped.signature == base.signature


@pytest.mark.parametrize("change", ["constant", "shape", "dtype", "edge", "layout"])
def test_a_different_constant_shape_dtype_edge_or_layout_changes_the_signature(change):
    """Each real difference in the computation or its interface gives another signature."""
    base = regions.from_function(_norm_modulate, *_examples())
    if change == "constant":
        other = regions.from_function(_norm_modulate_with(1e-5), *_examples())
    elif change == "shape":
        other = regions.from_function(_norm_modulate, *_examples(s=9))
    elif change == "dtype":
        other = regions.from_function(_norm_modulate, *_examples(dtype=torch.bfloat16))
    elif change == "edge":  # the same ops wired differently: (normed + shift) * (1 + scale)
        def rewired(x, w, shift, scale):
            normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
            return (normed + shift) * (1 + scale)

        other = regions.from_function(rewired, *_examples())
        assert sorted(other.text.exact.split()) != sorted(base.text.exact.split())
        assert other.text.exact.count("\n") == base.text.exact.count("\n")
    else:  # x arrives transposed in memory (same values, another layout)
        x, w, shift, scale = _examples()
        other = regions.from_function(_norm_modulate, x.transpose(1, 2).contiguous().transpose(1, 2), w, shift, scale)
    assert other.signature != base.signature


def test_roles_are_kept_on_inputs_but_are_not_part_of_the_key():
    """Binding time is the model's business: the same chain keys the same whether its weight is
    constant or per-call, and the region still records the role."""
    base = regions.from_function(_norm_modulate, *_examples())
    constant_weight = regions.from_function(_norm_modulate, *_examples(),
                                            roles=[Role.PER_CALL, Role.CONSTANT, Role.PER_CALL, Role.PER_CALL])
    assert constant_weight.signature == base.signature
    assert [s.role for s in constant_weight.inputs].count(Role.CONSTANT) == 1


def test_class_key_ignores_sizes_but_not_dtype_or_broadcasting():
    """The class key is the same at other sizes and differs for another dtype or broadcast pattern."""
    base = regions.from_function(_norm_modulate, *_examples())
    resized = regions.from_function(_norm_modulate, *_examples(b=3, s=781, d=64))
    assert resized.signature != base.signature and resized.class_key == base.class_key
    assert regions.from_function(_norm_modulate, *_examples(dtype=torch.float16)).class_key != base.class_key
    x, w, _, scale = _examples()
    per_token = regions.from_function(_norm_modulate, x, w, torch.randn(2, 8, 16), scale)
    assert per_token.class_key != base.class_key


def test_class_key_reads_flattening_views_as_sizes():
    """``view(x, [B*S, D])`` becomes ``[s0*s2, s1]``: the class key of a flattening holds at other sizes."""
    def flat_gelu(x):
        return torch.nn.functional.gelu(x.reshape(x.shape[0] * x.shape[1], x.shape[2]) * 2.0)

    small = regions.from_function(flat_gelu, torch.randn(2, 3, 5))
    large = regions.from_function(flat_gelu, torch.randn(4, 7, 64))
    assert small.class_key == large.class_key
    assert "s0*s" in small.text.by_class


def test_source_round_trip_keeps_the_signature():
    """The region's Python source (what the knowledge base stores) traces back to the same region."""
    base = regions.from_function(_norm_modulate, *_examples())
    again = regions.from_source(base.source, base.inputs)
    assert again.signature == base.signature
    x, w, shift, scale = _examples()
    namespace: dict = {}
    exec(base.source, namespace)
    expected = _norm_modulate(x, w, shift, scale)
    got = namespace["region"](*_canonical_inputs(base, x, w, shift, scale))[0]
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-6)


def _canonical_inputs(region, x, w, shift, scale):
    """The inputs in the region's canonical order, found through the nodes the region was cut from."""
    by_name = {"x_1": x, "w_1": w, "shift_1": shift, "scale_1": scale}
    return [by_name[node.name] for node in region.input_nodes]


def test_small_constants_are_part_of_the_key_and_weights_are_inputs():
    """A 0-d constant's value is in the key; a closed-over weight becomes a constant-role input."""
    weight = torch.randn(16, 16)

    def scaled(x, factor):
        return (x @ weight.t()) * torch.tensor(factor)

    first = regions.from_function(lambda x: scaled(x, 1000.0), torch.randn(4, 16))
    second = regions.from_function(lambda x: scaled(x, 1000.5), torch.randn(4, 16))
    assert first.signature != second.signature
    assert [s.role for s in first.inputs].count(Role.CONSTANT) == 1
    assert TensorSpec((16, 16), torch.float32, (16, 1), Role.CONSTANT) in first.inputs


@pytest.mark.parametrize("payload", [
    "import os\nos.system('true')\n",
    "import torch\n\naten = torch.ops.aten\n\n\ndef region(in0):\n    v0 = __import__('os').system('true')\n"
    "    return (v0,)\n",
    "import torch\n\naten = torch.ops.aten\n\n\ndef region(in0):\n    v0 = in0.__class__.__bases__\n"
    "    return (v0,)\n",
    "import torch\n\naten = torch.ops.aten\n\n\ndef region(in0):\n    v0 = torch.load('x')\n    return (v0,)\n",
])
def test_from_source_refuses_anything_but_rendered_aten_code(payload):
    """A region source from an imported file is checked before kopt traces it: only ATen calls pass."""
    base = regions.from_function(_norm_modulate, *_examples())
    with pytest.raises(ValueError, match="not a region source"):
        regions.from_source(payload, base.inputs)


def test_source_round_trip_for_every_corpus_region():
    """Reductions with getitems (var_mean), GEMMs, casts and constants all render to source that passes
    the check and traces back to the same signature."""
    from tests.agent.corpus.regions import REGIONS

    for spec in REGIONS.values():
        region = spec.build()
        assert regions.from_source(region.source, region.inputs).signature == region.signature, spec.name
    constant = regions.from_function(lambda x: x * torch.tensor([0.5, float("inf")]), torch.randn(3, 2))
    assert regions.from_source(constant.source, constant.inputs).signature == constant.signature
