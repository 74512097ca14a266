"""kopt.kernels._autotune: selection, in-memory and on-disk caching, the off switch, with a fake timer
(no GPU); and a launcher tuned through it, which must never disturb the caller's (aliased) buffers."""

from __future__ import annotations

import json

import pytest
import torch

from kopt.kernels import _autotune, gated_residual, gelu_tanh
from kopt.kernels._autotune import Tuner, config_name, pow2_bucket, shape_key
from tests.conftest import rel_err

CPU = torch.device("cpu")
CANDIDATES = [{"BLOCK": 1024, "num_warps": 4}, {"BLOCK": 2048, "num_warps": 8}, {"BLOCK": 4096, "num_warps": 8}]


class FakeTimer:
    """Returns the next of ``times`` for each call (after running the candidate once); counts calls."""

    def __init__(self, times):
        self.times = list(times)
        self.calls = 0

    def __call__(self, fn):
        fn()
        self.calls += 1
        return self.times.pop(0)


class Runner:
    """make_runner for the tuner: records which configs ran and how often it was asked for a runner."""

    def __init__(self):
        self.made = 0
        self.ran = []

    def __call__(self):
        self.made += 1
        return self.ran.append


def _no_runner():
    raise AssertionError("must not tune: the choice is cached")


def test_picks_the_fastest_and_records_timings(tmp_path):
    timer, runner = FakeTimer([3.0, 1.0, 2.0]), Runner()
    tuner = Tuner(path=tmp_path / "a.json", timer=timer, enabled=True)
    config = tuner.choose("k", "n=8", CANDIDATES, runner, CPU)
    assert config == CANDIDATES[1]
    assert runner.made == 1 and runner.ran == CANDIDATES
    choice = tuner.last["k"]
    assert choice.source == "tuned"
    assert choice.timings_ms == {config_name(c): t for c, t in zip(CANDIDATES, [3.0, 1.0, 2.0], strict=True)}


def test_ties_keep_the_default_and_failures_are_skipped(tmp_path):
    tuner = Tuner(path=tmp_path / "a.json", timer=FakeTimer([2.0, 2.0, 5.0]), enabled=True)
    assert tuner.choose("k", "tie", CANDIDATES, Runner(), CPU) == CANDIDATES[0]

    def flaky(fn):
        if flaky.calls == 0:
            flaky.calls += 1
            raise RuntimeError("out of resources")
        return 9.0 if flaky.calls == 1 else 1.0

    flaky.calls = 0
    tuner = Tuner(path=tmp_path / "b.json", timer=flaky, enabled=True)
    with pytest.warns(UserWarning, match="out of resources"):
        assert tuner.choose("k", "flaky", CANDIDATES, Runner(), CPU) == CANDIDATES[1]


def test_cached_in_memory_per_key(tmp_path):
    timer = FakeTimer([3.0, 1.0, 2.0, 1.0, 2.0, 3.0])
    tuner = Tuner(path=tmp_path / "a.json", timer=timer, enabled=True)
    first = tuner.choose("k", "n=8", CANDIDATES, Runner(), CPU)
    assert tuner.choose("k", "n=8", CANDIDATES, _no_runner, CPU) == first
    assert timer.calls == 3
    assert tuner.last["k"].source == "cache"
    # another key (or kernel) tunes again
    assert tuner.choose("k", "n=16", CANDIDATES, Runner(), CPU) == CANDIDATES[0]
    assert timer.calls == 6


def test_persists_to_disk_and_reloads_in_a_new_tuner(tmp_path):
    path = tmp_path / "sub" / "autotune.json"
    Tuner(path=path, timer=FakeTimer([3.0, 2.0, 1.0]), enabled=True).choose("k", "n=8", CANDIDATES, Runner(), CPU)
    data = json.loads(path.read_text())
    assert data["format"] == _autotune.FORMAT
    (entry,) = data["entries"].values()
    assert entry["config"] == CANDIDATES[2]
    assert list(tmp_path.joinpath("sub").iterdir()) == [path]  # no temp files left behind

    fresh = Tuner(path=path, timer=FakeTimer([]), enabled=True)  # an empty timer raises if it is used
    assert fresh.choose("k", "n=8", CANDIDATES, _no_runner, CPU) == CANDIDATES[2]
    assert fresh.last["k"].source == "cache"
    assert fresh.last["k"].timings_ms == entry["timings_ms"] and fresh.last["k"].default == config_name(CANDIDATES[0])
    # a second tuner's choice is merged into the file, not written over the first one's
    Tuner(path=path, timer=FakeTimer([1.0, 2.0, 3.0]), enabled=True).choose("k", "n=16", CANDIDATES, Runner(), CPU)
    assert len(json.loads(path.read_text())["entries"]) == 2


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("KOPT_CACHE_DIR", str(tmp_path / "env"))
    tuner = Tuner(timer=FakeTimer([2.0, 1.0, 3.0]), enabled=True)
    assert tuner.path == tmp_path / "env" / "autotune.json"
    tuner.choose("k", "n=8", CANDIDATES, Runner(), CPU)
    assert (tmp_path / "env" / "autotune.json").exists()


@pytest.mark.parametrize("text", ["{not json", json.dumps({"format": 0, "entries": {}}), "[1, 2]"])
def test_corrupt_or_stale_file_is_ignored_with_a_warning(tmp_path, text):
    path = tmp_path / "autotune.json"
    path.write_text(text)
    tuner = Tuner(path=path, timer=FakeTimer([3.0, 1.0, 2.0]), enabled=True)
    with pytest.warns(UserWarning, match="ignoring cache file"):
        assert tuner.choose("k", "n=8", CANDIDATES, Runner(), CPU) == CANDIDATES[1]
    assert json.loads(path.read_text())["format"] == _autotune.FORMAT  # rewritten as a valid cache


def test_cached_config_that_is_no_longer_a_candidate_is_retuned(tmp_path):
    path = tmp_path / "autotune.json"
    Tuner(path=path, timer=FakeTimer([3.0, 2.0, 1.0]), enabled=True).choose("k", "n=8", CANDIDATES, Runner(), CPU)
    timer = FakeTimer([2.0, 1.0])
    changed = CANDIDATES[:2]  # the kernel dropped the cached config
    assert Tuner(path=path, timer=timer, enabled=True).choose("k", "n=8", changed, Runner(), CPU) == changed[1]
    assert timer.calls == 2


def test_kopt_autotune_0_uses_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("KOPT_AUTOTUNE", "0")
    timer = FakeTimer([3.0, 1.0, 2.0])
    tuner = Tuner(path=tmp_path / "a.json", timer=timer)
    assert tuner.enabled() is False
    assert tuner.choose("k", "n=8", CANDIDATES, _no_runner, CPU) == CANDIDATES[0]
    assert tuner.last["k"].source == "default"
    assert timer.calls == 0 and not (tmp_path / "a.json").exists()
    monkeypatch.setenv("KOPT_AUTOTUNE", "1")
    assert tuner.choose("k", "n=8", CANDIDATES, Runner(), CPU) == CANDIDATES[1]


def test_no_timing_without_a_gpu(tmp_path):
    """The default timer (do_bench) needs CUDA: on the CPU / in the interpreter the default is used."""
    tuner = Tuner(path=tmp_path / "a.json", enabled=True)
    assert not tuner.can_time(CPU)
    assert tuner.choose("k", "n=8", CANDIDATES, _no_runner, CPU) == CANDIDATES[0]
    assert not (tmp_path / "a.json").exists()
    with pytest.raises(ValueError, match="no candidate"):
        tuner.choose("k", "n=8", [], _no_runner, CPU)


class CapturingTuner(Tuner):
    """A tuner whose device can be put "in capture": nothing can be timed, as while recording a CUDA graph."""

    timeable = True

    def can_time(self, device):
        return self.timeable


def test_a_launch_being_captured_gets_the_config_its_warm_up_tuned(tmp_path):
    """CUDA graphs record the launch of the call after the warm-up: it must get the tuned config,
    not the default (which every captured kopt kernel got before: a tuned choice was looked up only
    where timing was possible)."""
    tuner = CapturingTuner(path=tmp_path / "a.json", timer=FakeTimer([3.0, 1.0, 2.0]), enabled=True)
    assert tuner.choose("k", "n=8", CANDIDATES, Runner(), CPU) == CANDIDATES[1]  # the warm-up call tunes
    tuner.timeable = False
    assert tuner.choose("k", "n=8", CANDIDATES, _no_runner, CPU) == CANDIDATES[1]
    fresh = CapturingTuner(path=tmp_path / "a.json", timer=FakeTimer([]), enabled=True)  # another process
    fresh.timeable = False
    assert fresh.choose("k", "n=8", CANDIDATES, _no_runner, CPU) == CANDIDATES[1]
    assert fresh.last["k"].source == "cache"


def test_nothing_to_reuse_and_no_timing_gives_the_default_without_remembering_it(tmp_path):
    tuner = CapturingTuner(path=tmp_path / "a.json", timer=FakeTimer([3.0, 1.0, 2.0]), enabled=True)
    tuner.timeable = False
    assert tuner.choose("k", "n=8", CANDIDATES, _no_runner, CPU) == CANDIDATES[0]
    assert tuner.last["k"].source == "default"
    tuner.timeable = True  # the next call that can time tunes
    assert tuner.choose("k", "n=8", CANDIDATES, Runner(), CPU) == CANDIDATES[1]


def test_key_helpers():
    assert [pow2_bucket(n) for n in (0, 1, 3, 4096, 4097)] == [1, 1, 4, 4096, 8192]
    assert shape_key(n=3072, dtype=torch.bfloat16, rms=True) == "n=3072,dtype=bfloat16,rms=1"


# ------------------------------------------------------------------------------- through a launcher
def test_launcher_tunes_on_scratch_and_keeps_an_in_place_residual_exact(tmp_path, monkeypatch):
    """out=(r, m) updates the residual in place: tuning must not apply r += gate*y once per candidate."""
    g = torch.Generator().manual_seed(7)
    b, s, n = 2, 5, 96
    r = torch.randn(b, s, n, generator=g)
    y, gate = torch.randn(b, s, n, generator=g), torch.randn(b, n, generator=g)
    scale, shift = torch.randn(b, n, generator=g) * 0.5, torch.randn(b, n, generator=g)
    expected_r, expected_m = gated_residual.reference(r, y, gate, scale, shift)

    rows = pow2_bucket(b * s)
    candidates = gated_residual.candidates(n, rows)
    assert len(candidates) >= 3
    timer = FakeTimer([5.0] * (len(candidates) - 1) + [1.0])  # the last candidate wins
    monkeypatch.setattr(_autotune, "TUNER", Tuner(path=tmp_path / "a.json", timer=timer, enabled=True))
    m = torch.full_like(r, float("nan"))
    r_out, m_out = gated_residual.launch(r, y, gate, scale, shift, out=(r, m))
    assert r_out is r and m_out is m
    assert timer.calls == len(candidates)
    assert _autotune.TUNER.last["gated_residual"].config == candidates[-1]
    assert rel_err(r, expected_r) < 1e-6 and rel_err(m, expected_m) < 1e-5



def test_launcher_reuses_its_choice(tmp_path, monkeypatch):
    x = torch.randn(3, 7, 101, generator=torch.Generator().manual_seed(8))
    candidates = gelu_tanh.candidates(pow2_bucket(x.numel()), x.dtype)
    timer = FakeTimer([1.0 if i == 1 else 4.0 for i in range(len(candidates))])  # the second one wins
    monkeypatch.setattr(_autotune, "TUNER", Tuner(path=tmp_path / "a.json", timer=timer, enabled=True))
    first = gelu_tanh.launch(x)
    assert _autotune.TUNER.last["gelu_tanh"].config == candidates[1]
    again = gelu_tanh.launch(x)  # the timer is empty now: it would raise if used
    assert timer.calls == len(candidates) and _autotune.TUNER.last["gelu_tanh"].source == "cache"
    assert torch.equal(first, again)
    assert torch.equal(again, gelu_tanh.launch(x, config=candidates[1]))
    assert rel_err(again, gelu_tanh.reference(x)) < 1e-5


def _shipped(folder, key, config):
    folder.mkdir(parents=True, exist_ok=True)
    entries = {"|".join(("k", key, "cpu", f"triton {_autotune.triton.__version__}")): {"config": config}}
    (folder / "some-gpu.json").write_text(json.dumps({"format": _autotune.FORMAT, "entries": entries}))


def test_shipped_choices_are_used_untimed_never_saved_and_lose_to_the_users_file(tmp_path, monkeypatch):
    _shipped(tmp_path / "tuned", "n=8", CANDIDATES[2])
    path = tmp_path / "mine.json"
    tuner = Tuner(path=path, timer=FakeTimer([]), enabled=True, shipped=tmp_path / "tuned")
    assert tuner.choose("k", "n=8", CANDIDATES, _no_runner, CPU) == CANDIDATES[2]
    assert tuner.last["k"].source == "shipped" and not path.exists()  # nothing new to save
    assert tuner.sources == {"shipped": 1}  # benchmarks report what a cold compile timed and what it reused
    # the user's own measurement of the same key wins
    Tuner(path=path, timer=FakeTimer([1.0, 2.0, 3.0]), enabled=True, shipped=None).choose(
        "k", "n=8", CANDIDATES, Runner(), CPU)
    mine = Tuner(path=path, timer=FakeTimer([]), enabled=True, shipped=tmp_path / "tuned")
    assert mine.choose("k", "n=8", CANDIDATES, _no_runner, CPU) == CANDIDATES[0]
    assert mine.last["k"].source == "cache"
    assert len(json.loads(path.read_text())["entries"]) == 1  # the shipped entry was not copied in
    # KOPT_AUTOTUNE_SHIPPED=0: ignored, so the key is timed
    monkeypatch.setenv("KOPT_AUTOTUNE_SHIPPED", "0")
    timer = FakeTimer([3.0, 1.0, 2.0])
    off = Tuner(path=tmp_path / "other.json", timer=timer, enabled=True, shipped=tmp_path / "tuned")
    assert off.choose("k", "n=8", CANDIDATES, Runner(), CPU) == CANDIDATES[1] and timer.calls == 3


def test_a_shipped_config_that_is_no_longer_a_candidate_is_tuned(tmp_path):
    _shipped(tmp_path / "tuned", "n=8", {"BLOCK": 512, "num_warps": 2})
    timer = FakeTimer([3.0, 1.0, 2.0])
    tuner = Tuner(path=tmp_path / "a.json", timer=timer, enabled=True, shipped=tmp_path / "tuned")
    assert tuner.choose("k", "n=8", CANDIDATES, Runner(), CPU) == CANDIDATES[1]
    assert tuner.last["k"].source == "tuned" and timer.calls == 3


def test_the_shipped_files_are_valid_tuner_caches():
    files = sorted(_autotune.SHIPPED_DIR.glob("*.json"))
    assert files, "kernels/tuned/ ships no choices"
    for file in files:
        data = json.loads(file.read_text())
        assert data["format"] == _autotune.FORMAT and data["entries"]
        for key, entry in data["entries"].items():
            kernel, _shape, gpu, triton_version = key.split("|")
            assert kernel and gpu and triton_version.startswith("triton ")
            assert entry["config"] and all(type(v) is int for v in entry["config"].values())
