"""kopt.compile(model, regional=True): each repeated block compiled once per class, every block's weights."""

from __future__ import annotations

import pytest
import torch

import kopt
from kopt.regional import KoptRegional, repeated_blocks
from tests.conftest import rel_err, tiny_with_more_blocks


@pytest.mark.parametrize("name", ["flux2", "qwen-image"])
def test_one_graph_per_block_class_serves_every_block_with_its_own_weights(name):
    workload, model = tiny_with_more_blocks(name, extra=3)
    inputs = workload.inputs("tiny", seed=int(torch.randint(1 << 30, ())))
    with torch.no_grad():
        want = model(**inputs)[0]
    compiled = kopt.compile(model, regional=True, lower="eager", verify=True, progress=False)
    assert isinstance(compiled, KoptRegional) and compiled.blocks
    with torch.no_grad():
        got = compiled(**inputs)[0]
    assert rel_err(got, want) < 1e-5
    report = compiled.kopt_report
    classes = len(compiled.blocks)
    # dynamo compiles a block class at most twice (its first instance, then one graph for the rest)
    assert classes <= len(report.graphs) <= 2 * classes
    assert all(g.fallback is None for g in report.graphs)
    assert sum(p.total_matches for g in report.graphs for p in g.passes) > 0
    # one set of derived tensors (merged Q/K/V) per block instance of the class that has them
    sets = sum(g.weights.get("sets", 0) for g in report.graphs if g.weights.get("derived"))
    assert sets == len(model.transformer_blocks)
    assert compiled.undo() is model and all(getattr(b, "_compiled_call_impl", None) is None
                                            for b in repeated_blocks(model))


def test_a_model_without_repeated_blocks_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="no _repeated_blocks"):
        kopt.compile(torch.nn.Linear(4, 4), regional=True)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class _Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_compiling_the_same_model_again_and_again_never_runs_eagerly():
    # nn.Module.compile shares the block class's dynamo cache across compilations: the 9th found the
    # recompile limit (8) used up and ran the blocks eagerly, with no graph and no warning
    model = _Stack().eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        want = model.double()(x.double()).float()
    model.float()
    for _ in range(10):
        compiled = kopt.compile(model, regional=True, lower="eager", progress=False)
        with torch.no_grad():
            got = compiled(x)
        assert len(compiled.kopt_report.graphs) == 1  # one graph serves the three blocks, every time
        assert rel_err(got, want) < 1e-5
        compiled.undo()
