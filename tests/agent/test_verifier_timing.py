"""Timing in a fresh process: the harness reads the clock, every timed call gets new inputs and is
checked, so patched timers, cached results and fast wrong answers never become measurements."""

from __future__ import annotations

import torch

from kopt.agent import region as regions
from kopt.agent.candidate import Candidate, CandidateKind, original_candidate
from kopt.agent.verify import TimingConfig, VerifyConfig, time_candidate, verify
from kopt.passes.base import Contract

TOL = Contract.tolerance(1e-5)
TIMING = TimingConfig(input_sets=3, rounds=2, warmup=1)


def _region():
    return regions.from_function(lambda x: torch.softmax(x, -1) * 2.0, torch.randn(32, 48))


def _candidate(region, source):
    return Candidate(region.signature, CandidateKind.RULE_BY_EXAMPLE, source, TOL)


def test_original_is_timed_per_call_in_a_fresh_process():
    """The region's own source times cleanly: one sample per timed call, every call's output checked."""
    region = _region()
    timing, checks = time_candidate(region, original_candidate(region, TOL), VerifyConfig(), TIMING)
    assert timing is not None and len(timing.samples_ns) == 6 and min(timing.samples_ns) > 0
    assert all(c.passed for c in checks) and sum(c.name == "timing-values" for c in checks) == 6


def test_a_slow_candidate_measures_slow():
    """A candidate that sleeps 30 ms per call is measured at no less than 30 ms: the clock is the harness's."""
    region = _region()
    slow = _candidate(region, "import time\nimport torch\n\n\ndef candidate(x):\n    time.sleep(0.03)\n"
                              "    return torch.softmax(x, -1) * 2.0\n")
    timing, checks = time_candidate(region, slow, VerifyConfig(), TIMING)
    assert all(c.passed for c in checks) and timing.median_ns >= 30e6


def test_patching_the_timer_gets_no_timing():
    """A candidate that freezes time.perf_counter_ns (and sleeps, to have something to hide) is caught
    tampering; no timing comes back."""
    region = _region()
    cheat = _candidate(region, "import time\nimport torch\n\ntime.perf_counter_ns = lambda: 0\n\n\n"
                               "def candidate(x):\n    time.sleep(0.03)\n    return torch.softmax(x, -1) * 2.0\n")
    timing, checks = time_candidate(region, cheat, VerifyConfig(), TIMING)
    assert timing is None and any(c.name == "timing-tamper" and not c.passed for c in checks)


def test_caching_across_timed_calls_fails_the_timed_checks():
    """Returning the first call's result on later calls (fast, and right only once) fails on the next
    input set: every timed call's output is checked."""
    region = _region()
    cache = _candidate(region, "import torch\n\n_FIRST = []\n\n\ndef candidate(x):\n    if not _FIRST:\n"
                               "        _FIRST.append(torch.softmax(x, -1) * 2.0)\n    return _FIRST[0].clone()\n")
    timing, checks = time_candidate(region, cache, VerifyConfig(), TIMING)
    assert timing is None and any(c.name == "timing-values" and not c.passed for c in checks)


def test_verify_with_timing_attaches_the_measurement():
    """verify(..., timing=...) times an accepted candidate and puts the samples on the verdict."""
    region = _region()
    verdict = verify(region, original_candidate(region, TOL), VerifyConfig(shape_trials=2), TIMING)
    assert verdict.accepted and verdict.timing is not None and len(verdict.timing.samples_ns) == 6


def test_the_region_as_torch_compile_lowers_it_computes_the_region():
    """The micro baseline under an Inductor A/B: the region's source wrapped in torch.compile. Loaded
    here with ``aot_eager`` (the CPU sandbox refuses a compiler's file and process use; the GPU test
    times it with Inductor in the sandbox), it computes what the region computes."""
    from kopt.agent.candidate import lowered_original_candidate

    region = _region()
    lowered = lowered_original_candidate(region, backend="aot_eager")
    assert lowered.content_hash != original_candidate(region).content_hash
    eager, compiled = {}, {}
    exec(compile(region.source, "<region>", "exec"), eager)  # noqa: S102 - kopt's own generated source
    exec(compile(lowered.source, "<lowered>", "exec"), compiled)  # noqa: S102
    x = torch.randn(32, 48) * 3
    torch.testing.assert_close(compiled[lowered.entry_point](x), eager["region"](x))


_CHECK_INTEGRITY = """
import importlib, importlib.util, json, sys
import torch
guard_path, source, modules = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
spec = importlib.util.spec_from_file_location("kopt_verify_guard", guard_path)
guard = importlib.util.module_from_spec(spec)
spec.loader.exec_module(guard)
for name in modules:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
integrity = guard.Integrity(torch)
space = {}
exec(compile(source, "<lowered>", "exec"), space)
space["region"](torch.randn(32, 48))
print(integrity.changes())
"""


def test_the_lowered_original_preimports_what_loading_it_changes_in_torch():
    """Importing Dynamo wraps ``torch.manual_seed``: in the timing child (torch and the guard only, as
    here), after the integrity baseline, that read as tampering (the GPU test failed so, s17f). With
    the candidate's preimports loaded before the baseline, compiling and calling the region changes
    nothing the child watches."""
    import json
    import subprocess
    import sys

    from kopt.agent.candidate import lowered_original_candidate
    from kopt.agent.verify import guard
    from kopt.agent.verify.workdir import preimports

    region = _region()
    lowered = lowered_original_candidate(region, backend="aot_eager")
    assert "torch._dynamo" in preimports(lowered) and preimports(original_candidate(region)) == []

    def changes(modules: list[str]) -> str:
        run = subprocess.run([sys.executable, "-c", _CHECK_INTEGRITY, guard.__file__, lowered.source,
                              json.dumps(modules)], capture_output=True, text=True, timeout=300, check=True)
        return run.stdout.strip().splitlines()[-1]

    assert "torch.manual_seed replaced" in changes([])
    assert changes(preimports(lowered)) == "[]"
