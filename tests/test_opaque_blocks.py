"""``between_blocks="compiled"``: all of the model's own code is compiled, each repeated block's call one
``kopt::opaque_block`` op in its graph (:mod:`kopt.opaque_blocks`). The blocks keep one graph per
class, the model's code is one graph whatever the depth, FLUX.1's guidance is scaled without eager's
rounding, outputs that alias are copied, the agent's
sides keep their entry points, and ``undo()`` gives the module back."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import kopt
from kopt.opaque_blocks import CALLS_BLOCKS, holds_opaque_blocks, is_opaque
from kopt.reference import reference_forward
from kopt.workloads import get_workload
from tests.conftest import rel_err
from tests.test_regional_between_blocks import _TiedLM


def _ops(compiled: kopt.regional.KoptRegional) -> list[list[str]]:
    """Per compiled graph, the names of the functions dynamo's graph calls, in order."""
    return [[getattr(n.target, "__name__", str(n.target)) for n in g.dynamo_graph.graph.nodes
             if n.op == "call_function"] for g in compiled._kopt_backend.compiled]


def _untouched(model: nn.Module) -> bool:
    return all(getattr(m, "_compiled_call_impl", None) is None and "forward" not in m.__dict__
               and not is_opaque(m) and "_kopt_compiled" not in m.__dict__ for m in model.modules())


def _flux1(layers: int = 1, single: int = 1, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, dict]:
    import diffusers

    workload = get_workload("flux1")
    tiny = workload.build_model("tiny")
    config = {k: v for k, v in dict(tiny.config).items() if not k.startswith("_")}
    config.update(num_layers=layers, num_single_layers=single)
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(**config).to(dtype).eval().requires_grad_(False)
    inputs = workload.build_inputs("tiny", torch.device("cpu"), dtype, torch.Generator().manual_seed(1), False)
    return model, inputs


def test_the_models_code_is_one_graph_with_a_call_per_block_whatever_the_depth():
    counts = []
    for layers, single in ((1, 1), (2, 3)):
        model, inputs = _flux1(layers, single)
        with torch.no_grad():
            exact = reference_forward(model, **inputs)[0]
            compiled = kopt.compile(model, regional=True, lower="eager", between_blocks="compiled", progress=False)
            out = compiled(**inputs)[0]
        ops = _ops(compiled)
        outer = [o for o in ops if "opaque_block" in o]
        assert len(outer) == 1 and outer[0].count("opaque_block") == layers + single  # one call per block
        assert [holds_opaque_blocks(g.dynamo_graph) for g in compiled._kopt_backend.compiled].count(True) == 1
        assert "sin" in outer[0] and "cos" in outer[0]  # the timestep and guidance embeddings
        assert compiled.blocks == ["FluxSingleTransformerBlock", "FluxTransformerBlock"]
        assert compiled.kopt_report.graph_breaks == []
        assert rel_err(out, exact) < 1e-5
        counts.append(sum("opaque_block" not in o for o in ops))  # the blocks' own graphs
        compiled.undo()
        assert _untouched(model)
    # one per class: FLUX.1's later single blocks take slices whose batch stride differs, and compile no
    # second graph (kopt.unit_strides)
    assert counts == [2, 2], counts


def test_flux1s_guidance_is_scaled_without_eagers_rounding():
    """FLUX.1's forward computes ``guidance.to(bf16) * 1000`` (3500 -> 3504) before its sinusoid. With the
    model's code compiled, its step-invariant stage is computed in float32 and does not round: the output
    moves several times closer to the float32 reference than regional compilation with eager code between
    blocks. The model's graph is then checked, or, lowered nowhere (its per-call stage run as FX), says so."""
    model, inputs = _flux1(dtype=torch.bfloat16)
    with torch.no_grad():
        exact = reference_forward(model, **inputs)[0]
        errors = {}
        for between_blocks in ("eager", "compiled"):
            compiled = kopt.compile(model, regional=True, between_blocks=between_blocks, progress=False)
            errors[between_blocks] = rel_err(compiled(**inputs)[0], exact)
            graphs = compiled.kopt_report.graphs
            assert not any(g.fallback for g in graphs), [g.fallback for g in graphs]
            checks = [g.lowering_check for g in graphs]
            assert all(c is not None and c.ok for c in checks), checks
            assert all(not c.note or c.note.startswith("nothing in this graph was lowered") for c in checks), checks
            # the model's code and one graph per block class: no block compiled again inside the outer
            # graph's compile (its checks run the blocks as written)
            assert len(graphs) == (3 if between_blocks == "compiled" else 2)
            compiled.undo()
    print(f"tiny FLUX.1, bf16, rel err against float32: code between blocks eager {errors['eager']:.3g}, "
          f"compiled {errors['compiled']:.3g}")
    assert errors["compiled"] * 4 < errors["eager"], errors


class _Views(nn.Module):
    """Returns its input unchanged and two views of one new tensor: outputs an op may not alias."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor, ...]:
        y = self.proj(x) * scale
        return x, y[:, :3], y[:, 3:]


class _ViewStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Views() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = x
        for layer in self.layers:
            same, head, tail = layer(x, scale=0.5)
            total = total + same + torch.cat([head, tail], dim=1)
        return total


def test_outputs_that_alias_an_input_or_each_other_are_copied():
    torch.manual_seed(0)
    model = _ViewStack().eval().requires_grad_(False)
    x = torch.randn(5, 8)
    with torch.no_grad():
        eager = model(x)
        compiled = kopt.compile(model, regional=True, lower="eager", between_blocks="compiled", progress=False)
        assert torch.allclose(compiled(x), eager, rtol=1e-6, atol=1e-6)
        compiled.undo()
    assert _untouched(model)


class _PassThrough(TorchDispatchMode):
    """A dispatch mode that sees every op and changes nothing, as AOTAutograd's aliasing check on a
    compiled graph's first call does."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        return func(*args, **(kwargs or {}))


def test_a_block_first_called_under_a_dispatch_mode_is_rewritten_and_compiles_once():
    """Under a dispatch mode the op's implementation runs with every key above ``Python`` excluded; the
    block runs in a plain call's context all the same, so kopt's capture (its own modes) rewrites it,
    and dynamo's guards on the inputs' dispatch keys hold for plain calls after it: one compile. (A
    second process whose first call came through AOTAutograd's aliasing check ran the block
    unrewritten, and compiled it again for plain calls.)"""
    model, inputs = _flux1()
    block = model.transformer_blocks[0]
    seen: dict[str, object] = {}
    hook = block.register_forward_pre_hook(lambda _, a, k: seen.update(args=a, kwargs=k), with_kwargs=True)
    with torch.no_grad():
        model(**inputs)
        hook.remove()
        args, kwargs = seen["args"], seen["kwargs"]
        exact = reference_forward(block, *args, **kwargs)
        compiled = kopt.compile(model, regional=True, lower="eager", between_blocks="compiled", progress=False)
        with _PassThrough():
            moded = block(*args, **kwargs)  # the block's first call, and its compile
        plain = block(*args, **kwargs)
    (graph,) = compiled.kopt_report.graphs
    assert graph.fallback is None and sum(p.total_matches for p in graph.passes) > 0
    for out in (moded, plain):
        for got, want in zip(out, exact, strict=True):
            assert rel_err(got, want) < 1e-5
    compiled.undo()
    assert _untouched(model)


class _DictCall(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8)) for _ in range(2))
        for layer in self.layers:
            layer.forward = lambda x, extra, layer=layer: nn.Sequential.forward(layer, x) + extra["bias"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, {"bias": x})
        return x


def test_a_call_the_op_cannot_carry_breaks_the_graph_and_says_so():
    """A dict argument cannot ride on the op: that call breaks the graph (reported under its own name)
    and the block still runs its compiled code, with the same result."""
    torch.manual_seed(0)
    model = _DictCall().eval().requires_grad_(False)
    own = [layer.forward for layer in model.layers]  # instance forwards of the user's: put back by undo()
    x = torch.randn(2, 8)
    with torch.no_grad():
        eager = model(x)
        compiled = kopt.compile(model, regional=True, lower="eager", between_blocks="compiled", progress=False)
        out = compiled(x)
    assert torch.allclose(out, eager, rtol=1e-6, atol=1e-6)
    assert any("arguments_no_op_carries" in b for b in compiled.kopt_report.graph_breaks)
    assert any("linear" in ops for ops in _ops(compiled))  # the block compiled all the same
    compiled.undo()
    assert [layer.forward for layer in model.layers] == own and not any(is_opaque(m) for m in model.modules())


def test_the_agents_clock_puts_each_sides_entry_points_back():
    from kopt.agent.regional_clock import RegionalClock
    from kopt.passes.base import Contract

    torch.manual_seed(0)
    model = _TiedLM().eval().requires_grad_(False)
    ids = torch.randint(0, 1536, (1, 8))
    clock = RegionalClock(model, (ids,), lower="eager", between_blocks="compiled")
    try:
        assert len(clock.samples({}, 2, 0)) == 2
        rows = clock.model_checks({}, Contract.tolerance(1e-5), seed=3)
        assert rows and all(r["ok"] for r in rows)
        assert all(is_opaque(layer) for layer in model.layers) and model._compiled_call_impl is not None
        assert len(clock.report({}).graphs) == 2  # the model's code and the block class
    finally:
        clock.close()
    assert _untouched(model)


def test_new_sizes_compile_once_more_with_symbolic_sizes():
    """The op's fake implementation runs the block as written, so it follows symbolic sizes: a second
    prompt length recompiles once, and every later length reuses that graph, each output as eager's."""
    torch.manual_seed(0)
    model = _TiedLM().eval().requires_grad_(False)
    prompts = [torch.randint(0, 1536, (1, n)) for n in (8, 12, 5, 17)]
    with torch.no_grad():
        eager = [model(ids) for ids in prompts]
        compiled = kopt.compile(model, regional=True, lower="eager", between_blocks="compiled", progress=False)
        outs = [compiled(ids) for ids in prompts]
    assert len(compiled.kopt_report.graphs) == 4  # the model's code and the block, static then symbolic
    assert all(rel_err(out, ref) < 1e-5 for out, ref in zip(outs, eager, strict=True))
    compiled.undo()
    assert _untouched(model)


def test_while_the_model_compiles_blocks_alike_share_one_fake_run():
    """Dynamo's trace, kopt's capture, every pass that propagates shapes and the lowering each run the
    model's graph on fake tensors: while one call of the compiled model compiles, a block call whose
    block and arguments match an earlier one's reuses its outputs' metadata (kopt.fake_block_outputs).
    LTX-Video's identical blocks: one fake run in all (four per block without it, twelve here). The
    outputs are still the float64 reference's."""
    import diffusers
    from torch._subclasses.fake_tensor import FakeTensor

    workload = get_workload("ltx-video")
    config = {k: v for k, v in dict(workload.build_model("tiny").config).items() if not k.startswith("_")}
    torch.manual_seed(0)
    model = diffusers.LTXVideoTransformer3DModel(**{**config, "num_layers": 3}).eval()
    inputs = workload.build_inputs("tiny", torch.device("cpu"), torch.float32, torch.Generator().manual_seed(1), False)
    runs: list[int] = []
    for index, block in enumerate(model.transformer_blocks):
        def counted(*args, _forward=block.forward, _index=index, **kwargs):
            if any(isinstance(a, FakeTensor) for a in [*args, *kwargs.values()]):
                runs.append(_index)
            return _forward(*args, **kwargs)

        block.forward = counted
    with torch.no_grad():
        exact = reference_forward(model, **inputs)[0]
        compiled = kopt.compile(model, regional=True, lower="eager", between_blocks="compiled", progress=False)
        out = compiled(**inputs)[0]
    assert rel_err(out, exact) < 1e-5
    assert runs == [0], runs  # the first block, in dynamo's trace; every later call shares it


class _Repeating(nn.Module):
    """One class, equal weights' shapes, an output width set by a plain attribute."""

    def __init__(self, times: int) -> None:
        super().__init__()
        self.linear, self.times = nn.Linear(8, 8), times

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).repeat(1, self.times)


class _Widening(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Repeating(t) for t in (1, 2, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([layer(x) for layer in self.layers], dim=-1)


def test_blocks_whose_state_differs_do_not_share_a_fake_run():
    """Blocks of one class with the same weights' shapes but another attribute value (here the output
    width) each run on fake tensors: the key holds every module's non-tensor state."""
    from torch._subclasses.fake_tensor import FakeTensor

    torch.manual_seed(0)
    model = _Widening().eval()
    runs: list[int] = []
    for index, block in enumerate(model.layers):
        def counted(*args, _forward=block.forward, _index=index, **kwargs):
            if any(isinstance(a, FakeTensor) for a in args):
                runs.append(_index)
            return _forward(*args, **kwargs)

        block.forward = counted
    x = torch.randn(5, 8)
    with torch.no_grad():
        want = model.double()(x.double())
        model.float()
        compiled = kopt.compile(model, regional=True, lower="eager", between_blocks="compiled", progress=False)
        got = compiled(x)
    assert got.shape == (5, 32) and rel_err(got, want) < 1e-5
    assert runs == [0, 1], runs  # the third block is the first one's alike


class _HostReadInLoop(nn.Module):
    """A loop dynamo gives up on (a value read on the host between blocks), as Mochi's and HiDream's are."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
            if x.abs().max().item() > 1e6:
                x = x / 1e6
        return x


def test_a_loop_dynamo_runs_as_written_still_calls_each_block_through_its_graph():
    """Then each opaque forward is called as written (never compiled alone: each block's handle would
    become a symbolic int at the second block) and runs the block's compiled graph."""
    torch.manual_seed(0)
    model = _HostReadInLoop().eval().requires_grad_(False)
    x = torch.randn(4, 8)
    with torch.no_grad():
        eager = model(x)
        compiled = kopt.compile(model, regional=True, lower="eager", between_blocks="compiled", progress=False)
        outs = [compiled(x) for _ in range(2)]
    assert all(torch.allclose(out, eager, rtol=1e-6, atol=1e-6) for out in outs)
    assert sum("linear" in ops for ops in _ops(compiled)) == 1  # one graph for the three blocks
    compiled.undo()
    assert _untouched(model)


def test_a_constant_argument_is_carried_with_its_type():
    """``True == 1`` in Python: a call with ``flag=1`` after one with ``flag=True`` is another call (its
    block may branch on ``flag is True``), so the op records a call structure per type."""
    from kopt.opaque_blocks import _encoded

    codes = _encoded([True, 1, 1.0, None, {"a": 1}], [])
    assert codes[0] != codes[1] and codes[2] != codes[1]
    assert codes[3] == ("constant", "NoneType", None) and codes[4] is None


def test_the_encoding_collects_the_tensors_in_argument_order():
    """The op's tensors are the call's tensors in argument order, a tuple's items in place; a tuple with
    anything but tensors cannot be carried (and adds none of its tensors)."""
    from kopt.opaque_blocks import _encoded

    a, b, c, d = (torch.randn(2) for _ in range(4))
    tensors: list[torch.Tensor] = []
    codes = _encoded([a, (b, c), 3, [d], (a, 2)], tensors)
    assert codes == [("tensor",), ("tensors", "tuple", 2), ("constant", "int", 3), ("tensors", "list", 1), None]
    assert [id(t) for t in tensors] == [id(a), id(b), id(c), id(d)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_whole_forward_replays_with_the_blocks_as_ops():
    """On a GPU the compiled model is replayed from one CUDA graph (the model's code, and each block's
    graph through its op); fresh inputs give fresh outputs, and the guidance is still exact."""
    model, inputs = _flux1(dtype=torch.bfloat16)
    model = model.cuda()
    with torch.no_grad():
        outputs = []
        compiled = kopt.compile(model, regional=True, between_blocks="compiled", progress=False)
        for seed in range(5):
            fresh = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
            for name in ("hidden_states", "encoder_hidden_states"):  # new activations, same timestep and guidance
                fresh[name] = fresh[name] + 0.1 * seed * torch.randn_like(fresh[name])
            outputs.append((compiled(**fresh)[0].clone(), fresh))
        graphs = compiled.kopt_report.graphs
        stats = compiled.kopt_report.forward_replay
        last, fresh = outputs[-1]
        compiled.undo()
        exact = reference_forward(model, **fresh)[0]
        eager = model(**fresh)[0]
    assert stats.disabled is None and stats.recorded == 1 and stats.replays >= 2, stats.describe()
    assert len(graphs) == 3 and not any(g.fallback for g in graphs)
    # the model's graph never records its own CUDA graph (it would hold the blocks' kernels): the whole
    # forward is what is recorded, or else each block replays its own
    assert [g.cuda_graphs.disabled == CALLS_BLOCKS for g in graphs].count(True) == 1
    assert rel_err(last, exact) * 4 < rel_err(eager, exact)
    assert not torch.equal(outputs[0][0], outputs[-1][0])  # each replay computed its own inputs
