"""kopt.host_scalars: a Python number sent to a device becomes a fill of the same value and dtype while
a recording runs (so a CUDA graph can capture it); every other form goes to torch unchanged."""

from __future__ import annotations

import pytest
import torch

from kopt.cuda_graphs import CudaGraphRunner
from kopt.host_scalars import as_fill, host_scalars_as_fills
from tests.conftest import rel_err


@pytest.mark.parametrize("original", [torch.as_tensor, torch.tensor])
@pytest.mark.parametrize("value, dtype", [(7, None), (True, None), (2.5, None), (3, torch.float16),
                                          (1823, torch.int32), (-0.125, torch.float64)])
def test_a_number_on_a_device_is_a_fill_with_the_dtype_torch_would_infer(original, value, dtype):
    filled = original.__name__
    kwargs = {"device": "meta"} if dtype is None else {"device": "meta", "dtype": dtype}
    expected = original(value, **kwargs)
    got = as_fill(original)(value, **kwargs)
    assert (got.shape, got.dtype, got.device) == (expected.shape, expected.dtype, expected.device), filled
    on_cpu = as_fill(original)(value, dtype=dtype)  # the value itself, checked where it can be read
    assert on_cpu.item() == original(value, dtype=dtype).item()
    calls = []

    def spy(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    assert as_fill(spy)(value, **kwargs).device.type == "meta" and calls == []  # a fill on the device, no copy


def test_other_forms_go_to_torch_unchanged():
    calls = []

    def spy(data, *args, **kwargs):
        calls.append((data, args, kwargs))
        return torch.zeros(())

    wrapped = as_fill(spy)
    wrapped([1, 2], device="meta")  # a list
    wrapped(torch.ones(2), device="meta")  # a tensor
    wrapped(3, torch.float32)  # a positional argument (torch takes none today)
    wrapped(3, device="meta", requires_grad=False)  # another keyword
    wrapped(3, device="cpu")  # the host itself
    wrapped(3)  # no device
    assert len(calls) == 6


def test_the_patch_is_undone_even_when_the_block_raises():
    before = torch.as_tensor, torch.tensor
    with pytest.raises(RuntimeError), host_scalars_as_fills():
        assert torch.as_tensor is not before[0]
        raise RuntimeError("recording failed")
    assert (torch.as_tensor, torch.tensor) == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_forward_that_sends_a_python_number_to_the_gpu_is_recorded_and_replays_exactly():
    """Qwen-Image's form: a per-sample length from a mask, with the text length sent by torch.as_tensor."""
    def forward(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        positions = torch.arange(length, device=x.device)
        last = torch.where(mask, positions, positions.new_zeros(())).max(dim=1).values + 1
        per_sample = torch.where(mask.any(dim=1), last, torch.as_tensor(length, device=x.device))
        return x * per_sample[:, None, None].to(x.dtype) + torch.tensor(0.5, device=x.device)

    runner = CudaGraphRunner(forward, warmup=1)
    for _ in range(4):
        x = torch.randn(2, 16, 8, device="cuda")
        mask = torch.rand(2, 16, device="cuda") > 0.5
        mask[1] = False  # a sample with no active position takes the text length
        assert rel_err(runner(x, mask), forward(x, mask)) < 1e-6
    assert runner.stats.disabled is None and runner.stats.recorded == 1 and runner.stats.replays >= 2


def test_code_dynamo_compiled_recompiles_under_the_fills_once_so_a_warm_up_takes_that_compile():
    """Dynamo guards on ``torch.tensor`` itself: the first call under the fills compiles again. The
    runner's warm-ups run under them, so that compile happens there and not inside the capture (where
    its device work would invalidate the recording); later entries reuse it. This is the behaviour of
    dynamo the runner relies on; the runner itself needs CUDA (the GPU test below)."""
    compiles = []

    def backend(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    @torch.compile(backend=backend)
    def forward(x):
        return x * torch.tensor(2.0, device=x.device)

    x = torch.randn(8)
    forward(x)
    assert len(compiles) == 1
    with host_scalars_as_fills():
        assert rel_err(forward(x), x.double() * 2) < 1e-6
    assert len(compiles) == 2  # the warm-up's compile
    for _ in range(2):
        with host_scalars_as_fills():  # the capture's entry, and later recordings
            forward(x)
        forward(x)
    assert len(compiles) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_dynamo_compiled_forward_that_calls_torch_tensor_records_on_the_first_try():
    """Gemma 2's ``between_blocks="compiled"`` form: dynamo compiled the model's code, which calls
    ``torch.tensor``; the capture must not be where dynamo compiles for the fills."""
    def backend(gm, example_inputs):
        torch.cuda.synchronize()  # device work while compiling, as kopt's lowering check does
        return gm.forward

    @torch.compile(backend=backend)
    def forward(x):
        return x * torch.tensor(2.0, device=x.device) + 1

    runner = CudaGraphRunner(forward, warmup=1)
    for _ in range(4):
        x = torch.randn(64, device="cuda")
        assert rel_err(runner(x), x.double() * 2 + 1) < 1e-6
    assert runner.stats.disabled is None and runner.stats.skipped is None, runner.stats
    assert runner.stats.recorded == 1 and runner.stats.replays >= 2
