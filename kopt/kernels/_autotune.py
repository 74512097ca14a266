"""Per-shape autotuning of kernel launch configurations, cached in memory and on disk.

A launcher hands the tuner its kernel name, a shape key (row width, bucketed row count, dtype, ...),
its candidate configs (dicts of constexpr meta-parameters and launch options such as
``ROWS_PER_PROGRAM``, ``BLOCK_N``, ``num_warps``: the keyword arguments of ``kernel[grid](...)``)
and a way to run one candidate on scratch outputs. The first launch of a new key times every
candidate (``triton.testing.do_bench``, median) and keeps the fastest; later launches reuse it.

* The first candidate is the heuristic default. It is used without timing on the CPU, under
  ``TRITON_INTERPRET=1``, while a CUDA graph is being captured, and when ``KOPT_AUTOTUNE=0``.
* Choices persist as JSON in ``$KOPT_CACHE_DIR/autotune.json`` (default ``~/.cache/kopt``), keyed
  by kernel, shape key, device name and Triton version; written atomically (temp file + rename),
  merged with what other processes wrote. A corrupt or stale file is ignored with a warning; a
  cached config that is no longer a candidate (the kernel changed) is tuned again.
* Choices measured by kopt's own GPU benchmarks ship with it (``kopt/kernels/tuned/*.json``, the same
  format and keys): on a GPU and Triton version listed there, a first compile reuses them instead of
  timing every candidate (on an H200 that is most of a cold compile's time). The user's file wins
  over them, and ``KOPT_AUTOTUNE_SHIPPED=0`` ignores them. Valid because a key names the GPU model
  and the Triton version, and a shipped config that is no longer a candidate is tuned again.
* Candidates run on scratch outputs, so tuning never touches the caller's buffers (which may alias
  the inputs, e.g. an in-place residual update); the caller then launches the chosen config once.
* A new shape's candidates are compiled side by side first (:mod:`kopt.kernels._precompile`), then
  timed one by one.
* The timer is injectable (``Tuner(timer=...)``): tests check selection and caching on the CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import triton

log = logging.getLogger("kopt")  # one line per tuning at INFO

__all__ = ["TUNER", "Choice", "ChoiceUnknown", "Config", "Tuner", "block_candidates", "choose", "config_name",
           "known_choices_only", "launch_tuned", "pow2_bucket", "shape_key"]

Config = dict[str, int]
Timer = Callable[[Callable[[], object]], float]
FORMAT = 1


def pow2_bucket(n: int) -> int:
    """``n`` rounded up to a power of two (1 for n <= 1): row counts share a tuning entry per bucket."""
    return triton.next_power_of_2(max(int(n), 1))


def shape_key(**parts: object) -> str:
    """A readable, stable key from named parts: ``shape_key(n=3072, dtype=torch.bfloat16, rms=True)``
    -> ``"n=3072,dtype=bfloat16,rms=1"`` (dtypes without ``torch.``, bools as 0/1)."""

    def text(value: object) -> str:
        if isinstance(value, torch.dtype):
            return str(value).removeprefix("torch.")
        return str(int(value)) if isinstance(value, bool) else str(value)

    return ",".join(f"{name}={text(value)}" for name, value in parts.items())


def block_candidates(default: Config, widest: int, blocks: tuple[int, ...], warps: tuple[int, ...],
                     min_per_thread: int) -> tuple[Config, ...]:
    """Launch configs of a one-dimensional (BLOCK, num_warps) kernel: ``default`` first, then every
    BLOCK of ``blocks`` up to ``widest`` with every ``warps`` that gives each thread between
    ``min_per_thread`` and 32 elements (fewer leaves lanes idle, more spills registers)."""
    out = [dict(default)]
    for block in blocks:
        if block > widest:
            continue
        for num_warps in warps:
            config = {"BLOCK": block, "num_warps": num_warps}
            if min_per_thread <= block // (32 * num_warps) <= 32 and config not in out:
                out.append(config)
    return tuple(out)


def config_name(config: Config) -> str:
    """``{"ROWS_PER_PROGRAM": 2, "num_warps": 8}`` -> ``"ROWS_PER_PROGRAM=2,num_warps=8"``."""
    return ",".join(f"{k}={v}" for k, v in config.items())


def default_cache_file() -> Path:
    """``$KOPT_CACHE_DIR/autotune.json``, else ``~/.cache/kopt/autotune.json``."""
    from kopt.cache_dir import kopt_cache_dir

    return kopt_cache_dir() / "autotune.json"


SHIPPED_DIR = Path(__file__).parent / "tuned"


def _do_bench_ms(fn: Callable[[], object]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def interpreting() -> bool:
    """Whether Triton kernels run in its CPU interpreter (``TRITON_INTERPRET`` set and not 0)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


@dataclasses.dataclass(frozen=True)
class Choice:
    """What a launch used: the config, where it came from, and the timings when it was tuned now."""

    config: Config
    source: str  # "tuned" | "cache" | "shipped" | "default"
    timings_ms: dict[str, float] = dataclasses.field(default_factory=dict)  # config_name -> ms, when timed
    default: str = ""  # config_name of the heuristic default (candidates[0]), to compare against


class Tuner:
    """Picks and remembers the fastest candidate config per (kernel, shape key, device, Triton)."""

    def __init__(self, path: Path | None = None, timer: Timer | None = None, enabled: bool | None = None,
                 shipped: Path | None = SHIPPED_DIR) -> None:
        """``path``: the JSON file (default: ``default_cache_file()``, resolved when first needed);
        ``timer``: ms for one callable (default: do_bench median, CUDA only; an injected timer
        times on any device); ``enabled``: force tuning on/off (default: ``KOPT_AUTOTUNE != "0"``);
        ``shipped``: the folder of shipped choices (None: none; ``KOPT_AUTOTUNE_SHIPPED=0``: none)."""
        self._shipped_dir = shipped
        self._shipped: dict[str, dict[str, Any]] = {}  # full key -> entry, read-only (never saved)
        self._path = path
        self._timer = timer
        self._enabled = enabled
        self._entries: dict[str, dict[str, Any]] = {}  # full key -> {"config", "timings_ms"}, file + ours
        self._chosen: dict[tuple[str, str, str], Choice] = {}  # (kernel, key, device) -> this process's choice
        self._loaded = False
        self._lock = threading.RLock()
        self.last: dict[str, Choice] = {}  # kernel name -> its most recent choice (benchmarks report it)
        self.sources: dict[str, int] = {}  # keys decided in this process, by where the choice came from

    # ----------------------------------------------------------------------------------- policy
    @property
    def path(self) -> Path:
        """The JSON cache file this tuner reads and writes."""
        return self._path if self._path is not None else default_cache_file()

    def enabled(self) -> bool:
        """Whether tuning is on: the constructor's ``enabled``, else ``KOPT_AUTOTUNE`` (default on)."""
        if self._enabled is not None:
            return self._enabled
        return os.environ.get("KOPT_AUTOTUNE", "1").strip() != "0"

    def can_time(self, device: torch.device) -> bool:
        """An injected timer times anywhere; do_bench needs a real (not interpreted, not capturing) GPU."""
        if self._timer is not None:
            return True
        if device.type != "cuda" or interpreting():
            return False
        from kopt.capture_branch import really_capturing  # a rehearsal of a capture tunes: it is not one

        return not really_capturing()

    # ------------------------------------------------------------------------------------ choose
    def choose(
        self,
        kernel: str,
        key: str,
        candidates: Sequence[Config],
        make_runner: Callable[[], Callable[[Config], object]],
        device: torch.device,
    ) -> Config:
        """The config to launch ``kernel`` with for ``key``; tunes on the first call for a new key.

        ``candidates[0]`` is the heuristic default. ``make_runner()`` is called only when tuning and
        returns ``run(config)``, which launches one candidate on scratch outputs.

        A choice already made (in this process or in the cache file) is used even where nothing can
        be timed: a launch recorded into a CUDA graph (capture forbids timing) must get the config
        its warm-up call tuned, not the default. With nothing to reuse and no way to time, the
        default is returned and not remembered, so the next call that can time tunes."""
        if not candidates:
            raise ValueError(f"autotune: no candidate configs for {kernel} [{key}]")
        default = Choice(dict(candidates[0]), "default", default=config_name(candidates[0]))
        if not self.enabled() or not (self._timer is not None or (device.type == "cuda" and not interpreting())):
            return self._record(kernel, default)  # off, or the CPU / interpreter: nothing to tune or look up
        fast = self._chosen.get((kernel, key, str(device)))  # this process already decided: no lookups
        if fast is not None:
            return self._record(kernel, fast)
        candidates = [dict(c) for c in candidates]
        full_key = "|".join((kernel, key, _device_name(device), f"triton {triton.__version__}"))
        with self._lock:
            self._load_once()
            entry = self._entries.get(full_key)
            source = "cache"
            if entry is None and full_key in self._shipped:
                entry, source = self._shipped[full_key], "shipped"
            cached = [c for c in candidates if entry is not None and c == entry["config"]]
            if cached:  # a config that is no longer a candidate (the kernel changed) is tuned again
                choice = Choice(cached[0], source, dict(entry.get("timings_ms", {})), config_name(candidates[0]))
            elif _KNOWN_ONLY.active:
                raise ChoiceUnknown(f"{kernel} [{key}]: no choice yet; tuning times alone, later")
            elif not self.can_time(device):  # e.g. capturing a CUDA graph with this shape never run before
                return self._record(kernel, default)
            else:
                config, timings = self._tune(kernel, key, candidates, make_runner(), device)
                self._entries[full_key] = {"config": config, "timings_ms": timings}
                self._save()
                choice = Choice(config, "tuned", timings, config_name(candidates[0]))
            self._chosen[(kernel, key, str(device))] = dataclasses.replace(choice, source="cache")
            self.sources[choice.source] = self.sources.get(choice.source, 0) + 1
        return self._record(kernel, choice)

    def _record(self, kernel: str, choice: Choice) -> Config:
        self.last[kernel] = choice
        return dict(choice.config)

    def _tune(
        self, kernel: str, key: str, candidates: list[Config], run: Callable[[Config], object],
        device: torch.device,
    ) -> tuple[Config, dict[str, float]]:
        from kopt.kernels._precompile import precompile

        timer = self._timer or _do_bench_ms
        timings: dict[str, float] = {}
        start = time.perf_counter()
        workers = precompile(candidates, run, device) if device.type == "cuda" else 1
        for config in candidates:
            try:
                ms = float(timer(lambda config=config: run(config)))
            except Exception as exc:  # e.g. out of shared memory / registers for this config
                warnings.warn(f"autotune: {kernel} [{key}] {config_name(config)} failed: {exc}", stacklevel=3)
                ms = math.inf
            timings[config_name(config)] = ms
        best = min(candidates, key=lambda c: timings[config_name(c)])  # ties: the earlier (default first)
        log.info("autotune: %s [%s]: %d configs in %.1f s (compiled in %d threads), chose %s", kernel, key,
                 len(candidates), time.perf_counter() - start, workers, config_name(best))
        return best, timings

    # --------------------------------------------------------------------------------- disk cache
    def _read_file(self, path: Path | None = None) -> dict[str, dict[str, Any]]:
        """Valid entries of the JSON file; {} (with a warning) when it is corrupt or stale."""
        path = path or self.path
        if not path.exists():
            return {}
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
                raise ValueError(f"not an autotune cache of format {FORMAT}")
        except (OSError, ValueError) as exc:
            warnings.warn(f"autotune: ignoring cache file {path}: {exc}", stacklevel=4)
            return {}
        entries = {}
        for key, entry in data["entries"].items():
            config = entry.get("config") if isinstance(entry, dict) else None
            if isinstance(config, dict) and all(isinstance(k, str) and type(v) is int for k, v in config.items()):
                entries[key] = {"config": config, "timings_ms": entry.get("timings_ms", {})}
            else:
                warnings.warn(f"autotune: ignoring malformed cache entry {key!r} in {path}", stacklevel=4)
        return entries

    def _load_once(self) -> None:
        if not self._loaded:
            self._loaded = True
            self._entries = {**self._read_file(), **self._entries}
            if self._shipped_dir is not None and os.environ.get("KOPT_AUTOTUNE_SHIPPED", "1").strip() != "0":
                for file in sorted(self._shipped_dir.glob("*.json")):
                    self._shipped.update(self._read_file(file))

    def _save(self) -> None:
        """Merge this process's entries into the file and replace it atomically; failures only warn."""
        path = self.path
        try:
            from kopt.cache_dir import write_atomically

            merged = {**self._read_file(), **self._entries}
            write_atomically(path, json.dumps({"format": FORMAT, "entries": merged}, indent=1, sort_keys=True))
        except OSError as exc:
            warnings.warn(f"autotune: could not write cache file {path}: {exc}", stacklevel=4)


TUNER = Tuner()


class ChoiceUnknown(RuntimeError):
    """Raised by a launch under :func:`known_choices_only` that would have to tune first."""


class _KnownChoicesOnly(threading.local):
    active = False


_KNOWN_ONLY = _KnownChoicesOnly()


@contextlib.contextmanager
def known_choices_only() -> Iterator[None]:
    """In this thread, a launch whose config is not known yet (not chosen in this process, cached or
    shipped) raises :class:`ChoiceUnknown` instead of tuning: launches made ahead of time, side by
    side (:mod:`kopt.kernel_warmup`), must not time candidates while other kernels run."""
    before = _KNOWN_ONLY.active
    _KNOWN_ONLY.active = True
    try:
        yield
    finally:
        _KNOWN_ONLY.active = before


def choose(
    kernel: str,
    key: str,
    candidates: Sequence[Config],
    make_runner: Callable[[], Callable[[Config], object]],
    device: torch.device,
) -> Config:
    """``TUNER.choose(...)`` on the process-wide tuner (looked up per call, so tests can swap it)."""
    return TUNER.choose(kernel, key, candidates, make_runner, device)


def launch_tuned(name: str, key: str, candidates: Sequence[Config], run: Callable[..., None],
                 outputs: Sequence[torch.Tensor], device: torch.device, config: Config | None = None,
                 scratch: Callable[[], Sequence[torch.Tensor]] | None = None) -> Config:
    """``run(config, *outputs)``: a launcher's one call into the tuner. Without ``config`` the tuner
    picks one for ``key`` among ``candidates``, timing them on scratch outputs (``scratch()``, by
    default fresh tensors like ``outputs``), never on the caller's, which may alias the inputs (an
    in-place residual). Returns the config launched."""
    if config is None:
        def on_scratch() -> Callable[[Config], None]:
            buffers = tuple(scratch()) if scratch is not None else tuple(torch.empty_like(o) for o in outputs)
            return lambda cfg: run(cfg, *buffers)

        config = choose(name, key, candidates, on_scratch, device)
    run(config, *outputs)
    return config
