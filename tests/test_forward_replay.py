"""Regional compilation's whole-forward CUDA-graph replay (kopt.forward_replay): what stands in for
the checks a replay skips — the call's signature, weights given new storage, weights behind derived
constants, kopt_refresh() — on the CPU where no graph is recorded, and on a GPU where it is."""

from __future__ import annotations

import copy

import pytest
import torch

import kopt
from kopt.config import WeightCheck
from kopt.forward_replay import ForwardReplay, ReplayGuard, fixed_key
from kopt.regional import KoptRegional
from tests.conftest import rel_err, tiny_model_and_inputs, tiny_with_more_blocks

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _tiny_flux(device: str = "cpu", extra: int = 2):
    """The zoo's tiny FLUX.2 with ``extra`` more blocks per list (fresh weights), float32."""
    workload, model = tiny_with_more_blocks("flux2", extra)
    return workload, model.to(device).eval()


def _tiny(name: str, device: str):
    workload, model, _ = tiny_model_and_inputs(name, seed=0)
    return workload, model.to(device).eval()


def _inputs(workload, device: str):
    inputs = workload.inputs("tiny", seed=int(torch.randint(1 << 30, ())))
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def test_fixed_arguments_key_by_value_and_anything_opaque_is_refused():
    assert fixed_key([(1, 2), {"a": None}]) == fixed_key([(1, 2), {"a": None}])
    assert fixed_key([(1, 2)]) != fixed_key([(1, 3)])
    assert fixed_key(True) != fixed_key(1)  # a bool flag is not the integer 1
    with pytest.raises(TypeError, match="Tensor"):
        fixed_key([torch.ones(2)])  # a tensor inside a list: its values would be baked into the recording
    with pytest.raises(TypeError, match="object"):
        fixed_key(object())


def test_regional_on_cuda_graphs_records_the_forward_not_each_block_and_cpu_calls_run_plainly():
    workload, model = _tiny_flux()
    reference = copy.deepcopy(model)
    compiled = kopt.compile(model, regional=True, lower="eager", cuda_graphs=True, progress=False)
    assert isinstance(compiled, KoptRegional) and isinstance(compiled._replay, ForwardReplay)
    assert "held back" in compiled._kopt_backend.graphs_held_back  # blocks: the forward is what is recorded
    inputs = _inputs(workload, "cpu")
    with torch.no_grad():
        got, want = compiled(**inputs)[0], reference(**inputs)[0]
    assert rel_err(got, want) < 1e-5
    stats = compiled.kopt_report.forward_replay
    assert stats.recorded == 0 and stats.plain_calls == 1 and "CUDA device" in stats.skipped
    assert "whole forward: CUDA graphs" in str(compiled.kopt_report)
    plain = kopt.compile(copy.deepcopy(reference), regional=True, lower="eager", progress=False)
    assert plain._replay is None and plain.kopt_report.forward_replay is None  # eager lowering: off by default


def test_the_replay_guard_sees_new_storage_and_writes_behind_derived_constants():
    workload, model = _tiny_flux()
    compiled = kopt.compile(model, regional=True, lower="eager", cuda_graphs=True, share_weights=False,
                            progress=False)
    with torch.no_grad():
        compiled(**_inputs(workload, "cpu"))
    guards = compiled._kopt_backend.weight_guards()
    assert len(guards) == len(model.transformer_blocks)  # the blocks with derived constants (merged Q/K/V)
    guard = ReplayGuard(model, guards, WeightCheck.CHECKSUM)
    assert guard.weights is not None and not guard.moved()
    assert guard.weights.changed(guard.watched) == []
    watched = next(t for t in guard.watched if t.dim() == 2)
    watched.data.copy_(torch.randn_like(watched))  # as PEFT hot-swaps: no version bump
    assert guard.weights.changed(guard.watched) != []
    head = model.proj_out.weight
    head.data = head.data.clone()  # new storage for a weight read live
    assert guard.moved()
    versions = ReplayGuard(model, guards, WeightCheck.VERSION)
    assert versions.weights is not None and versions.weights.watched_bytes == 0
    assert ReplayGuard(model, guards, None).weights is None  # on_weight_change="ignore": nothing watched


def _replayed_model(name: str = "flux2", **options):
    workload, model = _tiny_flux("cuda") if name == "flux2" else _tiny(name, "cuda")
    reference = copy.deepcopy(model)
    compiled = kopt.compile(model, regional=True, progress=False, **options)
    return workload, model, reference, compiled


def _check(compiled, reference, workload, bound=2e-3):
    inputs = _inputs(workload, "cuda")
    with torch.no_grad():
        got = compiled(**inputs)[0].clone()
        want = reference(**inputs)[0]
    assert rel_err(got, want) < bound
    return got


@pytest.mark.gpu
@needs_cuda
def test_the_whole_forward_replays_from_one_graph_and_matches_eager_on_fresh_inputs():
    workload, _model, reference, compiled = _replayed_model()
    outputs = []
    for _ in range(6):
        inputs = _inputs(workload, "cuda")
        with torch.no_grad():
            outputs.append((compiled(**inputs)[0], reference(**inputs)[0]))
    for got, want in outputs:  # earlier outputs were copied out, not overwritten by later replays
        assert rel_err(got, want) < 2e-3
    stats = compiled.kopt_report.forward_replay
    assert stats.disabled is None, stats.disabled
    assert stats.recorded == 1 and stats.replays >= 3, stats.describe()
    for graph in compiled.kopt_report.graphs:  # no per-block recordings
        assert graph.cuda_graphs.recorded == 0 and "held back" in graph.cuda_graphs.disabled


@pytest.mark.gpu
@needs_cuda
def test_a_hot_swapped_weight_behind_a_derived_constant_is_seen_before_the_replay():
    workload, model, reference, compiled = _replayed_model(share_weights=False)
    for _ in range(4):
        _check(compiled, reference, workload)
    replay = compiled._replay
    assert replay.stats.replays >= 1
    block = model.transformer_blocks[1]
    new = torch.randn_like(block.attn.to_q.weight) * 0.05
    with torch.no_grad():
        block.attn.to_q.weight.data.copy_(new)  # the merged Q/K/V was derived from it
        reference.transformer_blocks[1].attn.to_q.weight.copy_(new)
    _check(compiled, reference, workload)
    assert replay.resets == 1 and "derived constant changed" in replay.stats.skipped
    for _ in range(4):  # records again, and replays the new weights
        _check(compiled, reference, workload)
    assert replay.stats.recorded == 2


@pytest.mark.gpu
@needs_cuda
def test_a_weight_given_new_storage_is_seen_before_the_replay():
    workload, model, reference, compiled = _replayed_model()
    for _ in range(4):
        _check(compiled, reference, workload)
    new = torch.randn_like(model.proj_out.weight) * 0.05
    model.proj_out.weight.data = new.clone()
    with torch.no_grad():
        reference.proj_out.weight.copy_(new)
    _check(compiled, reference, workload)
    assert compiled._replay.resets == 1 and "new storage" in compiled._replay.stats.skipped
    for _ in range(4):  # warm-up, warm-up, record, replay
        _check(compiled, reference, workload)
    assert compiled._replay.stats.recorded == 2
    compiled.kopt_refresh()  # captures the blocks again: the recording goes too
    for _ in range(4):
        _check(compiled, reference, workload)
    assert compiled._replay.resets == 2 and compiled._replay.stats.recorded == 3


@pytest.mark.gpu
@needs_cuda
def test_a_forward_that_cannot_be_recorded_replays_each_block_from_a_graph_of_its_own():
    """A forward that copies a host list to the GPU on every call (a pageable copy, which no recording
    can hold; a lone Python number would be recorded as a fill, kopt.host_scalars, as Qwen-Image's text
    length now is): then each block's graph records per block (piecewise), with correct outputs.
    Eight calls: the whole forward warms up twice, fails its first recording, fails the retry (its
    last try), and only then are the blocks' graphs released, each warming up once before recording."""
    workload, model = _tiny("qwen-image", "cuda")
    reference = copy.deepcopy(model)
    original = model.forward

    def forward(*args, **kwargs):
        shift = torch.tensor([0.0, 0.0], device=kwargs["hidden_states"].device)[0]
        return original(*args, **{**kwargs, "timestep": kwargs["timestep"] + shift})

    model.forward = forward
    compiled = kopt.compile(model, regional=True, progress=False)
    for _ in range(8):
        _check(compiled, reference, workload)
    report = compiled.kopt_report
    assert report.forward_replay.disabled is not None, report.forward_replay.describe()
    assert compiled._kopt_backend.graphs_held_back is None
    recorded = sum(g.cuda_graphs.recorded for g in report.graphs if g.cuda_graphs is not None)
    replays = sum(g.cuda_graphs.replays for g in report.graphs if g.cuda_graphs is not None)
    assert recorded >= len(model.transformer_blocks) and replays >= len(model.transformer_blocks), str(report)


@pytest.mark.gpu
@needs_cuda
def test_a_forward_that_reads_its_mask_on_the_host_replays_whole_with_compiled_blocks():
    """Llama's forward reads its all-ones mask on the host outside capture (transformers' mask helper)
    and builds a full mask instead while a stream captures: the first recording fails, the second
    warms up as a capture runs (the blocks compile for the mask tensor there, not while capturing)
    and bakes in any read left; then the whole forward replays. Every call ran kopt's graphs (the
    diagnosis between the two left the blocks compiled), and the replays match eager on fresh inputs."""
    pytest.importorskip("transformers")
    workload, _model, reference, compiled = _replayed_model("llama")
    for _ in range(6):
        _check(compiled, reference, workload)
    report = compiled.kopt_report
    stats = report.forward_replay
    assert stats.disabled is None and stats.recorded == 1, stats.describe()
    assert stats.replays >= 2 and stats.guard_misses == 0, stats.describe()
    assert report.eager_calls == 0, str(report)


class _MaskedBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(24, 24)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        scale = torch.arange(1, 25, dtype=x.dtype, device=x.device).rsqrt()  # a constant staging folds
        y = x + torch.nn.functional.gelu(self.proj(x)) * scale
        return y if mask is None else y + mask[:, None]


class _CaptureBranchStack(torch.nn.Module):
    """Passes its blocks a (zero) mask only while a stream captures, as transformers' Llama does."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_MaskedBlock() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device) if torch.cuda.is_current_stream_capturing() \
            else None
        for layer in self.layers:
            x = layer(x, mask)
        return x


@pytest.mark.gpu
@needs_cuda
def test_blocks_needing_a_new_graph_under_capture_compile_before_the_recording_not_inside_it():
    """The blocks see a mask only under capture, so their graph for it is compiled in the recording
    unless kopt refuses (kopt.errors.CompileDuringCapture): there staging would fold its constant
    into a value the capture recorded but never computed (Llama's replays on the H200 returned noise).
    Refused, the first recording fails; the retry warms up as a capture runs, compiles the mask's
    graph outside it, and every replay matches the float64 reference on fresh inputs."""
    torch.manual_seed(0)
    model = _CaptureBranchStack().cuda().eval()
    reference = copy.deepcopy(model).double()
    compiled = kopt.compile(model, regional=True, progress=False)
    with torch.no_grad():
        for _ in range(7):
            x = torch.randn(64, 24, device="cuda")
            got, want = compiled(x), reference(x.double())
            assert rel_err(got, want) < 1e-4, compiled.kopt_report.forward_replay.describe()
    stats = compiled.kopt_report.forward_replay
    assert stats.disabled is None and stats.recorded == 1 and stats.replays >= 2, stats.describe()
    assert len(compiled.kopt_report.graphs) == 2  # the plain calls' block graph and the mask's
