"""Under regional compilation an Fp8Config's include and skip patterns select linears by their paths in
the model, block by block (``kopt/fp8/per_block.py``): blocks that select alike share a graph, the
others get graphs of their own, and a pattern that names layers is neither ignored nor applied to
every block alike."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import kopt
from kopt.fp8.config import Fp8Config
from kopt.fp8.per_block import NOTHING, block_config, block_groups
from kopt.reference import reference_forward
from tests.conftest import rel_err


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class _Stack(nn.Module):
    def __init__(self, depth: int = 4, width: int = 64) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Block(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _model() -> _Stack:
    torch.manual_seed(0)
    return _Stack().eval().requires_grad_(False)


def _fp8_matches(compiled) -> list[int]:
    return [next(p.total_matches for p in g.passes if p.name == "fp8-linear") for g in compiled.kopt_report.graphs]


def test_blocks_are_grouped_by_what_the_patterns_select_in_each():
    model = _model()
    config = Fp8Config(min_features=16, skip=("layers.0.*", "layers.3.fc2.*"))
    groups = block_groups(model, list(model.layers), config)
    assert [(g.selection, len(g.blocks)) for g in groups] == [
        ((), 1), (("fc1.weight", "fc2.weight"), 2), (("fc1.weight",), 1)]
    assert groups[1].blocks == (model.layers[1], model.layers[2])
    narrowed = block_config(config, groups[2].selection)
    assert narrowed.include == ("fc1.weight",) and narrowed.skip == () and narrowed.min_features == 16
    assert block_config(config, ()).include == (NOTHING,) and narrowed.selects("fc2.weight")
    plain = block_groups(model, list(model.layers), Fp8Config(include=("fc2.*",)))
    assert [(g.selection, len(g.blocks)) for g in plain] == [(None, 4)]  # names no layer: as it always was
    relative = block_groups(model, list(model.layers), Fp8Config(include=("fc2.*",), skip=("layers.1.*",)))
    assert [(g.selection, len(g.blocks)) for g in relative] == [(("fc2.weight",), 3), ((), 1)]  # either name


def test_a_skipped_layer_stays_in_full_precision_and_the_others_are_quantized():
    """skip=("layers.0.*", "layers.3.*"): blocks 0 and 3 compile without FP8 (one graph), 1 and 2 with it
    (another); the output lies between the all-FP8 and the no-FP8 compile's in error against float32."""
    model = _model()
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        exact = reference_forward(model, x)
        errors, matches = {}, {}
        for name, config in (("all", Fp8Config(min_features=16)),
                             ("ends skipped", Fp8Config(min_features=16, skip=("layers.0.*", "layers.3.*"))),
                             ("none", Fp8Config(min_features=16, include=("nothing.*",)))):
            torch._dynamo.reset()
            compiled = kopt.compile(model, regional=True, lower="eager", fp8=config, progress=False,
                                    release_weights=False)
            errors[name] = rel_err(compiled(x), exact)
            matches[name] = sorted(_fp8_matches(compiled))
            compiled.undo()
    assert matches == {"all": [2], "ends skipped": [0, 2], "none": [0]}
    assert errors["none"] < 1e-5 < errors["ends skipped"] < errors["all"], errors


def test_a_pattern_written_with_the_models_paths_selects_in_every_block():
    """include=("layers.*.fc1.weight",) names the first linear of every block by its path in the model:
    one graph, its fc1 quantized (before, the pattern matched no path inside the block's graph)."""
    model = _model()
    x = torch.randn(2, 8, 64)
    with torch.no_grad():
        compiled = kopt.compile(model, regional=True, lower="eager", progress=False, release_weights=False,
                                fp8=Fp8Config(min_features=16, include=("layers.*.fc1.weight",)))
        compiled(x)
    assert _fp8_matches(compiled) == [1]
    compiled.undo()


def test_the_models_code_compiled_takes_one_selection_for_all_blocks_and_says_so_otherwise():
    model = _model()
    x = torch.randn(2, 8, 64)
    with pytest.raises(ValueError, match="selects different linears in different blocks"):
        kopt.compile(model, regional=True, lower="eager", between_blocks="compiled", progress=False,
                     fp8=Fp8Config(min_features=16, skip=("layers.0.*",)))
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = kopt.compile(model, regional=True, lower="eager", between_blocks="compiled", progress=False,
                                release_weights=False, fp8=Fp8Config(min_features=16, include=("layers.*.fc2.*",)))
        compiled(x)
    assert 1 in _fp8_matches(compiled)  # the blocks' graph: fc2 in FP8
    compiled.undo()


def test_blocks_by_position_and_only_where_blocks_are_told_apart():
    """Fp8Config(blocks=(1, 2)): the middle blocks' linears in FP8, the first and last in full precision
    (two graphs); a whole-model compile, which cannot tell blocks apart, refuses it."""
    model = _model()
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(3))
    config = Fp8Config(min_features=16, blocks=[2, 1, 2])
    assert config.blocks == (1, 2)
    groups = block_groups(model, list(model.layers), config)
    assert [(g.selection, len(g.blocks)) for g in groups] == [((), 2), (("fc1.weight", "fc2.weight"), 2)]
    with torch.no_grad():
        compiled = kopt.compile(model, regional=True, lower="eager", fp8=config, progress=False,
                                release_weights=False)
        out = compiled(x)
    assert sorted(_fp8_matches(compiled)) == [0, 2]
    assert rel_err(out, reference_forward(model, x)) > 1e-4  # two blocks in FP8: not the float32 output
    compiled.undo()
    with pytest.raises(ValueError, match="needs kopt.compile"):
        kopt.compile(model, fp8=config, progress=False)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="needs kopt.compile"):
        torch.compile(model, backend="kopt", options={"fp8": config})(x)
    with pytest.raises(ValueError, match="non-negative"):
        Fp8Config(blocks=(-1,))
    with pytest.raises(ValueError, match=r"positions \[4, 5\], but _Stack has 4 repeated blocks"):
        block_groups(model, list(model.layers), Fp8Config(blocks=range(6)))


def test_an_fp8_choice_records_its_blocks_only_when_it_has_some():
    """The agent's FP8 options carry ``blocks`` when set and leave the key out otherwise, so choices
    recorded before the field existed keep their content hash; both decode back to the config."""
    from kopt.agent.pipeline_choice import _option_arguments, fp8_options

    plain, layered = Fp8Config(), Fp8Config(blocks=(3, 4))
    assert "blocks" not in fp8_options(plain)["fp8"] and fp8_options(layered)["fp8"]["blocks"] == [3, 4]
    assert _option_arguments(fp8_options(plain)) == [plain]
    assert _option_arguments(fp8_options(layered)) == [layered]
