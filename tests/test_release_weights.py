"""release_weights: after the first call the module's weights that no compiled graph reads are
freed (the bf16 originals of FP8 linears), outputs do not change, the weights still read are kept,
and a call needing a new compilation raises a clear error instead of computing with empty weights.
By default only with FP8 under regional compilation, and only on a GPU."""

from __future__ import annotations

import copy

import pytest
import torch

import kopt
from kopt.fp8 import Fp8Config
from kopt.reference import reference_forward
from kopt.release import DEFAULT_DEVICES, is_released, resolve_release
from tests.conftest import rel_err, tiny_model_and_inputs


def _model_and_inputs(name: str):
    return tiny_model_and_inputs(name, seed=41, dtype=torch.bfloat16)


@pytest.mark.parametrize("fp8", [True, False])
def test_unread_weights_are_freed_and_outputs_do_not_change(fp8):
    workload, model, inputs = _model_and_inputs("flux2")
    again = workload.inputs("tiny", seed=42, dtype=torch.bfloat16)  # same shapes, new values
    with torch.no_grad():  # the eager outputs, before any weight is released
        references = [model(**inputs)[0], model(**again)[0]]
    keep = kopt.compile(copy.deepcopy(model), fp8=Fp8Config(min_features=16) if fp8 else None, lower="eager")
    free = kopt.compile(model, fp8=Fp8Config(min_features=16) if fp8 else None, lower="eager",
                        release_weights=True)
    with torch.no_grad():
        for call_inputs, reference in zip((inputs, again), references, strict=True):
            out = free(**call_inputs)[0]
            assert torch.equal(out, keep(**call_inputs)[0])
            assert rel_err(out, reference) < (0.1 if fp8 else 2e-2)  # FP8- or bf16-sized, never garbage
    released = [name for name, p in model.named_parameters() if is_released(p)]
    if fp8:  # a quantized linear's bf16 weight is gone
        assert free.kopt_report.released_bytes > 0 and "released" in str(free.kopt_report)
        assert "transformer_blocks.0.attn.to_q.weight" in released
    else:  # the merged linears' weights are views of what the graph reads (share_weights): nothing to free
        assert not released and free.kopt_report.released_bytes == 0
    # weights the compiled graph still reads stay: the QK RMSNorm scales, read by kopt::qk_norm_rope
    still_read = [name for name, _ in model.named_parameters() if ".norm_q." in name or ".norm_k." in name]
    assert still_read and not set(still_read) & set(released)


@pytest.mark.parametrize("regional", [False, True])
def test_a_call_that_needs_a_new_compilation_raises_clearly(regional):
    """kopt's own error, not dynamo's BackendCompilerFailed around it (regional blocks included)."""
    _, model, inputs = _model_and_inputs("flux2")
    free = kopt.compile(model, fp8=Fp8Config(min_features=16), lower="eager", release_weights=True,
                        regional=regional)
    with torch.no_grad():
        free(**inputs)
        free.kopt_refresh()  # forces a recompilation, as a weight change would
        with pytest.raises(kopt.WeightsReleasedError, match="release_weights"):
            free(**inputs)


def test_by_default_only_regional_fp8_releases_and_only_weights_on_a_gpu():
    assert resolve_release(None, Fp8Config(), regional=True) == DEFAULT_DEVICES == ("cuda",)
    assert resolve_release(None, True, regional=True) == DEFAULT_DEVICES
    assert resolve_release(None, Fp8Config(), regional=False) is False  # whole-model keeps both unless asked
    assert resolve_release(None, None, regional=True) is False and resolve_release(None, False) is False
    assert resolve_release(False, Fp8Config()) is False and resolve_release(True, None, regional=False) is True


@pytest.mark.parametrize("release_weights", [None, False])
def test_on_the_cpu_by_default_or_when_asked_to_keep_nothing_is_freed(release_weights):
    _, model, inputs = _model_and_inputs("qwen-image")
    compiled = kopt.compile(model, fp8=Fp8Config(min_features=16), lower="eager", release_weights=release_weights)
    with torch.no_grad():
        compiled(**inputs)
        eager = model(**inputs)[0]  # the module still runs by itself
    assert compiled.kopt_report.released_bytes == 0
    assert not any(is_released(p) for p in model.parameters())
    assert rel_err(compiled(**inputs)[0], eager) < 0.1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("regional, release_weights", [(True, None), (False, None), (False, True)])
def test_on_a_gpu_regional_fp8_frees_the_bf16_weights_by_default_and_new_shapes_still_compile(regional,
                                                                                              release_weights):
    """Regional FP8 releases by default, and a new shape compiles again from the FP8 weights it made;
    whole-model FP8 keeps the weights unless asked, and released, a new shape says how to keep them."""
    from kopt.workloads import get_workload

    workload = get_workload("qwen-image")
    torch.manual_seed(0)
    model = workload.model("tiny", device="cuda", dtype=torch.bfloat16)
    inputs = workload.inputs("tiny", device="cuda", dtype=torch.bfloat16, seed=41)
    resized = workload.resized(inputs, height=8, width=6, text=7, seed=3)
    bigger = {k: (v.to("cuda", torch.bfloat16) if v.is_floating_point() else v.cuda())
              if isinstance(v, torch.Tensor) else v for k, v in resized.items()}
    with torch.no_grad():
        exact = reference_forward(model, **inputs)[0]
        exact_bigger = reference_forward(model, **bigger)[0]
    compiled = kopt.compile(model, fp8=Fp8Config(min_features=16), regional=regional, release_weights=release_weights)
    released = regional or release_weights
    with torch.no_grad():
        for _ in range(3):  # compile and release, then replays
            assert rel_err(compiled(**inputs)[0], exact) < 0.1
        assert (compiled.kopt_report.released_bytes > 0) == bool(released)
        assert any(is_released(p) for p in model.parameters()) == bool(released)
        if regional or not released:
            for _ in range(3):
                assert rel_err(compiled(**bigger)[0], exact_bigger) < 0.1
            assert rel_err(compiled(**inputs)[0], exact) < 0.1
        else:
            with pytest.raises(kopt.WeightsReleasedError, match="release_weights=False"):
                compiled(**bigger)
    if released:
        assert "release_weights" in str(compiled.kopt_report)


def test_regional_new_shapes_after_a_release_run_with_the_first_graphs_fp8_weights():
    """After the release, a new shape makes dynamo compile the block class again: kopt traces it on
    stand-ins for the freed weights and takes each block's FP8 weights from the first graphs (same
    weights, same recipe), so the output is exactly what keeping the weights gives."""
    workload, model, inputs = _model_and_inputs("qwen-image")
    resized = workload.resized(inputs, height=8, width=6, text=7, seed=3)
    bigger = {k: v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
              for k, v in resized.items()}
    with torch.no_grad():
        exact = reference_forward(model, **bigger)[0]
    fp8 = Fp8Config(min_features=16)
    keep = kopt.compile(copy.deepcopy(model), fp8=fp8, lower="eager", regional=True, release_weights=False)
    free = kopt.compile(model, fp8=fp8, lower="eager", regional=True, release_weights=True)
    with torch.no_grad():
        first = free(**inputs)[0]
        assert free.kopt_report.released_bytes > 0
        out = free(**bigger)[0]
        assert torch.equal(out, keep(**bigger)[0]) and rel_err(out, exact) < 0.1
        assert torch.equal(free(**inputs)[0], first)
    assert free.kopt_report.graphs[-1].weights["derived_from"].startswith("earlier graphs")


def test_regional_compilation_frees_every_blocks_quantized_weights():
    """regional=True: one graph per block class serves every block; each block's bf16 originals of
    its FP8 linears are freed after the first call (not only the block it was compiled from), the
    weights read live stay, and outputs do not change."""
    workload, model, inputs = _model_and_inputs("qwen-image")  # two blocks of one class
    again = workload.inputs("tiny", seed=42, dtype=torch.bfloat16)
    with torch.no_grad():
        references = [model(**inputs)[0], model(**again)[0]]
        exact = [reference_forward(model, **call)[0] for call in (inputs, again)]  # higher precision, op by op
    fp8 = Fp8Config(min_features=16)
    keep = kopt.compile(copy.deepcopy(model), fp8=fp8, lower="eager", regional=True)
    free = kopt.compile(model, fp8=fp8, lower="eager", regional=True, release_weights=True)
    with torch.no_grad():
        for call_inputs, reference, fp32 in zip((inputs, again), references, exact, strict=True):
            out = free(**call_inputs)[0]
            assert torch.equal(out, keep(**call_inputs)[0])
            assert rel_err(out, reference) < 0.1  # FP8-sized, never garbage
            assert rel_err(out, fp32) < 0.1  # and against the float32 reference, not eager bf16 alone
    released = {name for name, p in model.named_parameters() if is_released(p)}
    blocks = [name.split(".attn.to_q.weight")[0] for name, _ in model.named_parameters()
              if name.endswith(".attn.to_q.weight")]
    assert len(blocks) >= 2 and all(f"{block}.attn.to_q.weight" in released for block in blocks)
    assert free.kopt_report.released_bytes > 0
    still_read = [name for name, _ in model.named_parameters() if ".norm_q." in name or ".norm_k." in name]
    assert still_read and not set(still_read) & released


class _SlicingBlock(torch.nn.Module):
    """FLUX.1's single-stream form: text and image joined, then returned as slices of one tensor, so
    that at batch 2 the second block is called with views of other strides and dynamo compiles the
    class again (at batch 1 the stride that differs is a size-1 dimension's: :mod:`kopt.unit_strides`)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.out = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = c.shape[1]
        h = torch.cat([c, x], dim=1)
        h = h + self.out(torch.nn.functional.gelu(self.proj(h)))
        return h[:, :n], h[:, n:]


class _Slicing(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([_SlicingBlock() for _ in range(3)])

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            c, x = block(x, c)
        return x


def test_a_block_class_compiled_twice_serves_released_blocks_from_the_other_graphs_weights():
    """After the release, the newer graph of a block class is called with a block the older graph
    served: it takes that block's FP8 weights from the older graph (same weights, same recipe) instead
    of failing to quantize freed weights (FLUX.1 on the H200, s18b), and computes what keeping does."""
    torch.manual_seed(0)
    model = _Slicing().to(torch.bfloat16)
    x, c = torch.randn(2, 24, 32, dtype=torch.bfloat16), torch.randn(2, 8, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        exact = reference_forward(model, x, c)
    fp8 = Fp8Config(min_features=16)
    keep = kopt.compile(copy.deepcopy(model), fp8=fp8, lower="eager", regional=True, release_weights=False)
    free = kopt.compile(model, fp8=fp8, lower="eager", regional=True, release_weights=True)
    with torch.no_grad():
        for _ in range(3):
            out = free(x, c)
            assert torch.equal(out, keep(x, c))
            assert rel_err(out, exact) < 0.1
    assert len(free.kopt_report.graphs) == 2  # the class was compiled twice
    released = {name for name, p in model.named_parameters() if is_released(p)}
    assert {f"blocks.{i}.{layer}.weight" for i in range(3) for layer in ("proj", "out")} <= released


class _Watched(_Slicing):
    """Notes, after each block's call, whether that block's FP8-replaced weight is already freed."""

    def __init__(self) -> None:
        super().__init__()
        self.freed_after_call: list[bool] = []

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            c, x = block(x, c)
            self.freed_after_call.append(is_released(block.proj.weight))
        return x


def test_regional_frees_each_blocks_weights_as_soon_as_its_derived_ones_exist():
    """Within the first call, each block's bf16 weights are freed right after its FP8 copies are made,
    so the first call never holds every bf16 and FP8 weight at once; the output is still exact."""
    torch.manual_seed(0)
    model = _Watched().to(torch.bfloat16)
    x, c = torch.randn(1, 24, 32, dtype=torch.bfloat16), torch.randn(1, 8, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        exact = reference_forward(model, x, c)
    keep = kopt.compile(copy.deepcopy(model), fp8=Fp8Config(min_features=16), lower="eager", regional=True,
                        release_weights=False)
    free = kopt.compile(model, fp8=Fp8Config(min_features=16), lower="eager", regional=True, release_weights=True)
    model.freed_after_call.clear()
    with torch.no_grad():
        out = free(x, c)
        assert model.freed_after_call == [True, True, True]  # already during the first call
        assert torch.equal(out, keep(x, c)) and rel_err(out, exact) < 0.1
        assert torch.equal(free(x, c), out)
    assert not any(keep._orig_mod.freed_after_call)


def test_undo_after_a_release_warns_that_the_module_cannot_run_by_itself():
    _, model, inputs = _model_and_inputs("qwen-image")
    free = kopt.compile(model, fp8=Fp8Config(min_features=16), lower="eager", regional=True, release_weights=True)
    with torch.no_grad():
        free(**inputs)
    with pytest.warns(RuntimeWarning, match="release_weights=False"):
        assert free.undo() is model
