"""What diffusers' own torch.compile tests check, through its real entry points, with kopt as the
backend: a whole-model ``fullgraph`` compile has no graph break and does not recompile on a second
call; regional compilation (``compile_repeated_blocks``) compiles each block class once and every
block computes with its own weights; the rewrites fire (no fallback) and the outputs match eager."""

from __future__ import annotations

import pytest
import torch

import kopt
from tests.conftest import rel_err
from tests.test_lora_hotswap import MODELS, _output


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_fullgraph_compile_no_graph_break_no_recompilation(name):
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    breaks = dict(torch._dynamo.utils.counters["graph_break"])
    compiled = torch.compile(model.eval(), backend="kopt", fullgraph=True)
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(2):
            assert rel_err(_output(compiled(**inputs)), _output(model(**inputs))) < 1e-4
    assert dict(torch._dynamo.utils.counters["graph_break"]) == breaks
    # backend="kopt" keeps one report per options in a process: this compilation's graph is the last
    graphs = kopt.last_backend_report().graphs[-1:]
    assert graphs[0].fallback is None and graphs[0].lowering == "inductor"
    assert sum(p.total_matches for p in graphs[0].passes if p.name == "sibling-merge") > 0


def _with_blocks(name, blocks):
    """The tiny model with ``blocks`` repeated transformer blocks (of each kind)."""
    from diffusers import FluxTransformer2DModel, QwenImageTransformer2DModel

    model, inputs = MODELS[name]()
    config = dict(model.config)
    if isinstance(model, FluxTransformer2DModel):  # its single blocks take a strided input: one kind repeated
        config.update(num_layers=blocks, num_single_layers=1)
    else:
        config.update(num_layers=blocks)
    cls = FluxTransformer2DModel if isinstance(model, FluxTransformer2DModel) else QwenImageTransformer2DModel
    torch.manual_seed(0)
    return cls.from_config(config).eval(), inputs


@pytest.mark.parametrize("name", list(MODELS))
def test_repeated_blocks_compile_once_and_each_block_uses_its_own_weights(name):
    """One compiled graph serves every block of a class; each block's merged weights are its own (kopt
    keeps one set of derived constants per block), with no recompilation and nothing derived again."""
    model, inputs = _with_blocks(name, 3)
    with torch.no_grad():
        reference = _output(model(**inputs))
    backend = kopt.make_backend(lower="eager")  # a backend of its own: a report of this model only
    model.compile_repeated_blocks(fullgraph=True, backend=backend)
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=1):
        for _ in range(2):
            assert rel_err(_output(model(**inputs)), reference) < 1e-5
    report = backend.report
    repeated = [g for g in report.graphs if g.weights.get("sets", 0) == 3]
    assert repeated, [g.weights for g in report.graphs]
    assert all(g.fallback is None and g.weight_rederivations == 0 and g.weight_refreshes == 0 for g in report.graphs)
    assert report.matches("sibling-merge") > 0


@pytest.mark.parametrize("share", [True, False], ids=["shared", "kept-apart"])
@pytest.mark.parametrize("name", list(MODELS))
def test_repeated_blocks_after_a_write_into_one_block(name, share):
    """A ``.data`` write into one block's Q weight reaches that block's next call: through the
    merged weight it is a view of (shared), or derived again for that block only (kept apart)."""
    model, inputs = _with_blocks(name, 2)
    backend = kopt.make_backend(lower="eager", share_weights=share)
    model.compile_repeated_blocks(fullgraph=True, backend=backend)
    with torch.no_grad():
        model(**inputs)
        to_q = model.transformer_blocks[1].attn.to_q.weight
        to_q.data.copy_(torch.randn_like(to_q))
        compiled_out = _output(model(**inputs))
    for block in model.transformer_blocks:  # the same model, run eagerly
        block._compiled_call_impl = None
    with torch.no_grad():
        assert rel_err(compiled_out, _output(model(**inputs))) < 1e-5
    assert sum(g.weight_rederivations for g in backend.report.graphs) == (0 if share else 1)
