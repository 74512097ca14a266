"""share_weights (the default): module weights that a merged constant holds row for row are views
of it, so their bytes are held once; every way of writing a weight still reaches the next call."""

from __future__ import annotations

import copy

import pytest
import torch

import kopt
from kopt.fx.shared_weights import adjacent_rows, row_blocks
from tests.conftest import rel_err


class Attention(torch.nn.Module):
    """Q/K/V reading one input (sibling-merge fires) and an output projection no pass transforms."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(width, width) for _ in range(3))
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        return self.out(torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v)


def _storages(*tensors: torch.Tensor) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _compiled(**options):
    torch.manual_seed(0)
    model = Attention().eval()
    reference = copy.deepcopy(model).double()
    compiled = kopt.compile(model, lower="eager", **options)
    return model, reference, compiled


def _check(compiled, model, x):
    """The compiled output against a float64 copy of the model's weights as they are now."""
    reference = copy.deepcopy(model).double()
    assert rel_err(compiled(x), reference(x.double())) < 1e-5


def test_merged_weights_hold_the_module_weights_bytes_once():
    model, reference, compiled = _compiled()
    x = torch.randn(2, 8, 32)
    weights = [model.q.weight, model.k.weight, model.v.weight]
    before = _storages(*model.parameters())
    with torch.no_grad():
        assert rel_err(compiled(x), reference(x.double())) < 1e-5
    graph = compiled._kopt_backend.compiled[0]
    derived = [tensor for _, tensor in graph.binding.derived]
    assert len({w.untyped_storage().data_ptr() for w in weights}) == 1  # one storage: the merged weight
    assert _storages(*model.parameters(), *derived) == before  # module weights + what the graph reads
    report = compiled.kopt_report.graphs[0].weights
    assert report["shared_bytes"] == sum(t.numel() * t.element_size() for t in [*weights, model.q.bias,
                                                                                 model.k.bias, model.v.bias])
    assert report["watched_bytes"] == 0  # every watched weight is a view: no checksum per call
    assert "views of the merged weights" in str(compiled.kopt_report)


def test_without_sharing_the_module_keeps_its_own_weights():
    model, reference, compiled = _compiled(share_weights=False)
    pointers = [p.data_ptr() for p in model.parameters()]
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        assert rel_err(compiled(x), reference(x.double())) < 1e-5
    assert [p.data_ptr() for p in model.parameters()] == pointers
    assert compiled.kopt_report.graphs[0].weights["watched_bytes"] > 0


@pytest.mark.parametrize("write", ["data-copy", "data-add", "copy", "load_state_dict"])
def test_every_in_place_write_reaches_the_next_call(write):
    model, _, compiled = _compiled()
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        compiled(x)
        new = torch.randn(32, 32) / 6
        if write == "data-copy":  # PEFT's hot-swap
            model.k.weight.data.copy_(new)
        elif write == "data-add":  # PEFT's merge of an adapter
            model.k.weight.data += new
        elif write == "copy":
            model.k.weight.copy_(new)
        else:
            model.load_state_dict(Attention().state_dict())
        _check(compiled, model, x)


def test_a_weight_given_new_storage_is_derived_again_and_watched_by_content_after():
    """``param.data = other`` leaves the merged weight (kopt never re-points a storage the caller
    chose): seen by the storage check, derived again, and from then on checksummed, so a later
    ``.data`` write to it is seen too."""
    model, _, compiled = _compiled()
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        compiled(x)
        other = torch.randn(32, 32) / 6
        model.v.weight.data = other
        _check(compiled, model, x)
        assert model.v.weight.data_ptr() == other.data_ptr()
        model.v.weight.data.copy_(torch.randn(32, 32) / 6)
        _check(compiled, model, x)
    graph = compiled.kopt_report.graphs[0]
    assert graph.weight_rederivations == 2 and graph.weight_refreshes == 0


def test_a_new_parameter_object_is_derived_again():
    model, _, compiled = _compiled()
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        compiled(x)
        model.q.weight = torch.nn.Parameter(torch.randn(32, 32) / 6)
        _check(compiled, model, x)


def test_a_compilation_for_new_shapes_reuses_the_merged_storage():
    """A second graph (new shapes, static) concatenates weights that already are consecutive rows of
    the first graph's merged weight: it reads that same storage instead of copying it."""
    _, reference, compiled = _compiled(dynamic=False)
    with torch.no_grad():
        for length in (8, 5):
            x = torch.randn(2, length, 32)
            assert rel_err(compiled(x), reference(x.double())) < 1e-5
    graphs = compiled._kopt_backend.compiled
    assert len(graphs) == 2
    first, second = ({t.untyped_storage().data_ptr() for _, t in g.binding.derived} for g in graphs)
    assert first == second


def test_safetensors_saves_and_loads_shared_weights(tmp_path):
    from safetensors.torch import load_file, save_file

    model, _, compiled = _compiled()
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        compiled(x)
    state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    save_file(state, tmp_path / "model.safetensors")
    loaded = load_file(tmp_path / "model.safetensors")
    assert all(torch.equal(loaded[name], tensor) for name, tensor in state.items())


class Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Attention() for _ in range(3))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def test_each_block_of_a_regional_compile_shares_its_own_weights():
    torch.manual_seed(0)
    model = Stack().eval()
    reference = copy.deepcopy(model).double()
    compiled = kopt.compile(model, lower="eager", regional=True)
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        assert rel_err(compiled(x), reference(x.double())) < 1e-5
        for block in model.blocks:
            assert block.q.weight.untyped_storage().data_ptr() == block.v.weight.untyped_storage().data_ptr()
        model.blocks[2].k.weight.data.copy_(torch.randn(32, 32) / 6)
        _check(compiled, model, x)


def test_adjacent_rows_is_a_view_only_for_consecutive_rows():
    base = torch.randn(10, 4)
    joined = adjacent_rows([base[0:3], base[3:10]])
    assert joined is not None and joined.data_ptr() == base.data_ptr() and torch.equal(joined, base)
    assert adjacent_rows([base[3:10], base[0:3]]) is None  # out of order
    assert adjacent_rows([base[0:3], base[4:10]]) is None  # a gap
    assert adjacent_rows([base[0:3], torch.randn(7, 4)]) is None  # another storage
    assert row_blocks(base, [torch.randn(3, 4), torch.randn(6, 4)]) is None  # rows do not add up
    assert [b.shape[0] for b in row_blocks(base, [torch.randn(3, 4), torch.randn(7, 4)])] == [3, 7]


def test_a_failed_lowering_after_sharing_falls_back_with_the_weights_as_traced(monkeypatch):
    """Sharing moves the weights before the rewritten graph is lowered; if that lowering fails, the
    original graph is lowered instead, and it must see the weights where dynamo traced them: moved,
    Inductor's fakes of them disagree with dynamo's trace ("int(sym)=0 != hint=…") and the whole
    compile fails."""
    from kopt.compiled_graph import CompiledGraph

    def failing(self, *args, **kwargs):
        raise RuntimeError("the rewritten graph did not lower")

    monkeypatch.setattr(CompiledGraph, "_lower_rewritten", failing)
    torch.manual_seed(0)
    model = Attention(width=64).eval()
    reference = copy.deepcopy(model).double()
    compiled = kopt.compile(model, lower="inductor", cuda_graphs=False, progress=False)
    x = torch.randn(2, 8, 64)
    with torch.no_grad():
        assert rel_err(compiled(x), reference(x.double())) < 1e-5
    assert "lowering the rewritten graph failed" in str(compiled.kopt_report)
    assert all(p.storage_offset() == 0 for p in model.parameters())
    assert _storages(*model.parameters()) == sum(p.numel() * p.element_size() for p in model.parameters())
