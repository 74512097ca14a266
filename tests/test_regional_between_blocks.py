"""Regional compilation of the large linears between the blocks (``between_blocks="linears"``): an
LLM's LM head is found by what it is (a linear outside every repeated block, at least 1024 features
in and out), compiled on its own, and reached by FP8; by default the code between blocks runs eagerly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import kopt
from kopt.fp8 import Fp8Config
from kopt.reference import reference_forward
from kopt.regional import linears_between_blocks, regional_modules
from tests.conftest import rel_err


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class _TinyLM(nn.Module):
    """Blocks in a ModuleList, a small projection in, and an LM head of 1024 x 1536 out."""

    def __init__(self, width: int = 1024, vocab: int = 1536) -> None:
        super().__init__()
        self.embed = nn.Linear(64, width)  # 64 input features: too small to be worth a graph
        self.layers = nn.ModuleList(_Block(width) for _ in range(2))
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def tiny_lm() -> _TinyLM:
    """The tiny LM with seeded weights, for inference (the agent tests use it too)."""
    torch.manual_seed(0)
    return _TinyLM().eval().requires_grad_(False)


def test_the_lm_head_is_found_by_what_it_is():
    model = tiny_lm()
    assert linears_between_blocks(model) == [model.head]  # not the blocks' linears, not the small one
    assert regional_modules(model) == list(model.layers)
    assert regional_modules(model, "linears") == [*model.layers, model.head]
    with pytest.raises(ValueError, match="between_blocks must be one of"):
        regional_modules(model, "everything")


def test_fp8_reaches_the_lm_head_only_when_it_is_compiled():
    model = tiny_lm()
    x = torch.randn(2, 8, 64)
    with torch.no_grad():
        exact = reference_forward(model, x)
        fp8 = Fp8Config(min_features=16)
        eager_head = kopt.compile(model, regional=True, lower="eager", fp8=fp8, release_weights=False)
        out_eager_head = eager_head(x)
        assert eager_head.blocks == ["_Block"]
        eager_head.undo()
        compiled = kopt.compile(model, regional=True, lower="eager", fp8=fp8, release_weights=False,
                                between_blocks="linears")
        out = compiled(x)
    assert compiled.blocks == ["Linear", "_Block"]
    graphs = compiled.kopt_report.graphs
    fp8_graphs = [g for g in graphs if any(r.name == "fp8-linear" and r.matches for r in g.passes)]
    assert len(fp8_graphs) == 2  # the block class and the head
    assert 0 < rel_err(out, exact) < 0.1  # FP8-sized against the float32 reference: quantized, not garbage
    assert not torch.equal(out, out_eager_head)  # the head's GEMM is FP8 now
    with pytest.raises(ValueError, match="is for regional=True"):
        kopt.compile(model, between_blocks="linears")


class _TiedLM(nn.Module):
    """Token ids in, the embedding's weight tied to the LM head (as Gemma 2's is)."""

    def __init__(self, width: int = 1024, vocab: int = 1536) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(_Block(width) for _ in range(2))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


@pytest.mark.parametrize("between_blocks", ["linears", "compiled"])
def test_a_weight_the_code_between_blocks_reads_is_never_released(between_blocks):
    """The LM head's FP8 copy makes its bf16 weight unread by any compiled graph, but the embedding,
    which runs between the blocks, reads the same tensor: releasing it would feed the next call freed
    memory. The blocks' bf16 originals of their FP8 linears are released as before. With "compiled"
    the head is in the model's graph (kopt.opaque_blocks), with "linears" in one of its own."""
    from kopt.release import is_released

    torch.manual_seed(0)
    model = _TiedLM().eval().requires_grad_(False)
    ids = torch.randint(0, 1536, (1, 8))
    with torch.no_grad():
        exact = reference_forward(model, ids)
        compiled = kopt.compile(model, regional=True, lower="eager", fp8=Fp8Config(min_features=16),
                                release_weights=True, between_blocks=between_blocks, progress=False)
        first = compiled(ids)
        second = compiled(ids)
    graphs = compiled.kopt_report.graphs
    assert sum(any(r.name == "fp8-linear" and r.matches for r in g.passes) for g in graphs) == 2  # block, head
    assert compiled.kopt_report.released_bytes > 0  # the blocks' quantized linears
    assert not is_released(model.embed.weight) and model.embed.weight is model.head.weight
    assert any(is_released(p) for p in model.layers.parameters())
    assert torch.equal(first, second) and 0 < rel_err(second, exact) < 0.1
