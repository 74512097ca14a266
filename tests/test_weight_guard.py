"""The weight guard sees every write to a watched weight, in every dtype and layout, through any alias."""

from __future__ import annotations

import pytest
import torch

from kopt.config import WeightCheck
from kopt.weight_guard import SMALL_BYTES, WeightGuard, row_checksums

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.complex64, torch.int64]


def _weight(shape, dtype):
    value = torch.randn(shape, dtype=torch.complex64 if dtype.is_complex else torch.float32) * 3
    return value.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(300, 129), (257, 64), (20000,), (7,), (3, 5, 11)], ids=str)
def test_a_one_element_write_through_data_is_seen(dtype, shape):
    """Large weights (row checksums, aligned or not) and small ones (compared whole), written through
    ``.data``, which leaves the version counter alone."""
    weight = torch.nn.Parameter(_weight(shape, dtype), requires_grad=False)
    guard = WeightGuard([0], WeightCheck.CHECKSUM, {0: weight})
    assert guard.changed({0: weight}) == []
    flat = weight.data.view(-1)
    index = flat.numel() // 3
    wide = torch.complex64 if dtype.is_complex else torch.float32
    flat[index] = (flat[index].to(wide) + (1j if dtype.is_complex else 4)).to(dtype)  # a different value
    assert weight._version == 0  # the write did not bump it (the premise)
    assert guard.changed({0: weight}) == [0]


def test_rows_swapped_in_place_are_seen_and_the_guard_is_quiet_after_a_snapshot():
    weight = _weight((256, 256), torch.bfloat16)
    assert weight.numel() * weight.element_size() > SMALL_BYTES
    guard = WeightGuard([3], WeightCheck.CHECKSUM, {3: weight})
    weight.data[[0, 17]] = weight.data[[17, 0]]
    assert guard.changed({3: weight}) == [3]
    guard.snapshot({3: weight})
    assert guard.changed({3: weight}) == []


def test_a_non_contiguous_weight_is_read_afresh_each_call():
    """A transposed weight cannot be viewed as rows in place: it is read (copied) per call, never cached."""
    base = _weight((300, 200), torch.float32)
    weight = base.t()
    guard = WeightGuard([0], WeightCheck.CHECKSUM, {0: weight})
    base.data[5, 7] += 1.0
    assert guard.changed({0: weight}) == [0]


def test_only_the_changed_weights_are_named_among_many():
    weights = {i: _weight((128 + i, 160), torch.bfloat16) for i in range(6)}
    weights.update({10 + i: _weight((33,), torch.float32) for i in range(4)})
    guard = WeightGuard(list(weights), WeightCheck.CHECKSUM, weights)
    weights[4].data[100, 3] = 7.0
    weights[12].data[0] = -1.0
    assert sorted(guard.changed(weights)) == [4, 12]


def test_version_check_sees_writes_through_the_tensor_and_new_storage_only():
    weight = _weight((300, 300), torch.float32)
    guard = WeightGuard([0], WeightCheck.VERSION, {0: weight})
    weight.data[0, 0] = 5.0
    assert guard.changed({0: weight}) == []  # the documented blind spot
    weight.add_(1.0)
    assert guard.changed({0: weight}) == [0]
    guard.snapshot({0: weight})
    weight.data = torch.zeros(300, 300)
    assert guard.changed({0: weight}) == [0]


def test_checksums_are_one_per_row():
    weight = _weight((37, 64), torch.bfloat16)
    assert row_checksums(weight).shape == (37,)
    assert row_checksums(_weight((37, 63), torch.bfloat16)).shape == (37,)  # odd rows: element-wise path


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_comparison_runs_beside_other_work_and_sees_writes_queued_before_it():
    """The side-stream comparison waits for writes queued on the caller's stream before it starts."""
    weights = {0: _weight((2048, 1024), torch.bfloat16).cuda(), 1: _weight((64,), torch.float32).cuda()}
    guard = WeightGuard([0, 1], WeightCheck.CHECKSUM, weights)
    checks = guard.start(weights)
    assert not checks[0].ready and checks[0].changed() == []
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(4):
        big = big @ big / 64  # keep the caller's stream busy so the write below is still queued
    weights[0].data[1000].add_(1.0)
    weights[1].data[3] = 123.0
    assert sorted(guard.changed(weights)) == [0, 1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_recorded_comparison_sees_every_later_write():
    """The comparison is recorded once as a CUDA graph; its replays still see writes made afterwards,
    through ``.data`` as well, and new storage is caught first and recorded anew."""
    weights = {i: _weight((512 + 64 * i, 256), torch.bfloat16).cuda() for i in range(6)}
    weights[6] = _weight((32,), torch.float32).cuda()
    guard = WeightGuard(list(weights), WeightCheck.CHECKSUM, weights)
    for _ in range(3):
        assert guard.changed(weights) == []
    (group,) = guard._groups
    assert group.graph_error is None and group._graph is not None
    weights[4].data[100, 7] += 1.0
    weights[6].data[0] = -3.0
    assert sorted(guard.changed(weights)) == [4, 6]
    guard.snapshot(weights)
    assert guard.changed(weights) == []
    weights[2].data = weights[2].detach().clone()
    assert guard.changed(weights) == [2]
    guard.snapshot(weights)
    weights[2].data[5].mul_(2.0)
    assert guard.changed(weights) == [2]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_inside_another_cuda_graph_recording_only_versions_are_checked():
    weights = {0: _weight((1024, 256), torch.bfloat16).cuda()}
    guard = WeightGuard([0], WeightCheck.CHECKSUM, weights)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        checks = guard.start(weights)
    assert [check.ready for check in checks] == [True] and checks[0].changed() == []
