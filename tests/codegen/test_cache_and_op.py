"""The disk + in-process cache, op registration, and the KOPT_DEBUG source dump."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kopt.codegen import cache, compile_region
from tests.codegen.conftest import only_region
from tests.conftest import rel_err


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("KOPT_CACHE_DIR", str(folder))
    cache.forget_loaded()
    yield folder
    cache.forget_loaded()


def _region(constant: float):
    """A small two-output region; ``constant`` makes its code (so its key) unique to the test."""
    def fn(x, y):
        a = x * constant + y
        return a, torch.tanh(a) * y

    return only_region(fn, torch.randn(5, 37) + 0.1, torch.randn(5, 37) + 0.1)


def _counts() -> tuple[int, int, int, int]:
    return dataclasses.astuple(cache.STATS)


def test_second_build_neither_rewrites_nor_reimports(cache_dir):
    _, region = _region(1.25)
    writes, imports, hits, repairs = _counts()
    first = compile_region(region)
    assert _counts() == (writes + 1, imports + 1, hits, repairs)
    assert first.path.parent == cache_dir and first.path.name == f"kopt_gen_{first.key}.py"
    stamp = first.path.stat().st_mtime_ns
    second = compile_region(region)
    assert _counts() == (writes + 1, imports + 1, hits + 1, repairs)
    assert second.module is first.module and second.op is first.op and second.key == first.key
    assert first.path.stat().st_mtime_ns == stamp


def test_a_new_process_reads_the_disk_without_writing(cache_dir):
    _, region = _region(2.5)
    first = compile_region(region)
    cache.forget_loaded()  # as if in a fresh process
    writes, imports, hits, repairs = _counts()
    again = compile_region(region)
    assert _counts() == (writes, imports + 1, hits, repairs)
    assert again.module is not first.module and again.op is first.op  # the op is registered once


def test_corrupt_cache_file_is_regenerated(cache_dir):
    graph_module, region = _region(3.75)
    path = compile_region(region).path
    cache.forget_loaded()
    path.write_text(path.read_text()[:-40] + "garbage(")  # torn write
    writes, imports, hits, repairs = _counts()
    repaired = compile_region(region)
    assert _counts() == (writes + 1, imports + 1, hits, repairs + 1)
    x, y = torch.randn(5, 37) + 0.1, torch.randn(5, 37) + 0.1
    for got, want in zip(repaired.module.launch(x, y), graph_module(x, y), strict=True):
        assert rel_err(got, want) < 1e-5


def test_equal_code_shares_a_key_and_an_op_whatever_the_node_names(cache_dir):
    def one(x, y):
        return torch.sigmoid(x * 4.5) + y

    def other(left, right):  # same computation, other names
        return torch.sigmoid(left * 4.5) + right

    inputs = (torch.randn(5, 37), torch.randn(5, 37))
    a = compile_region(only_region(one, *inputs)[1])
    b = compile_region(only_region(other, *inputs)[1])
    assert a.key == b.key and a.op is b.op
    assert "left_1" in b.source and "left_1" not in a.source  # each keeps its own readable comments


def test_key_depends_on_triton_version_and_device(monkeypatch):
    source = "x = 1  # a comment\n"
    key = cache.cache_key(source)
    assert cache.cache_key("x = 1  # another comment\n") == key
    assert cache.device_name() == "cpu-interpreter"
    monkeypatch.setattr(cache.triton, "__version__", "0.0.0")
    assert cache.cache_key(source) != key


def test_op_runs_reference_on_cpu_and_has_a_fake(cache_dir):
    graph_module, region = _region(5.5)
    generated = compile_region(region)
    assert generated.op is getattr(torch.ops.kopt, generated.name).default
    x, y = torch.randn(5, 37) + 0.1, torch.randn(5, 37) + 0.1
    for got, want in zip(generated.op(x, y), graph_module(x, y), strict=True):
        assert rel_err(got, want) < 1e-6
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = generated.op(mode.from_tensor(x), mode.from_tensor(y))
    assert [tuple(t.shape) for t in fake] == [(5, 37), (5, 37)]


def test_kopt_debug_dumps_the_source(cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("KOPT_DEBUG", str(tmp_path / "trace"))
    _, region = _region(6.25)
    generated = compile_region(region)
    dumped = tmp_path / "trace" / "codegen" / f"{generated.name}.py"
    assert dumped.read_text() == generated.source
