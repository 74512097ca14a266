"""The model zoo: every built-in workload, tiny, on the CPU, in fp32 and bf16, through
``kopt.compile(passes="auto")`` lowered by Inductor, against a float64 copy of the same weights.

kopt's relative error must stay within ``BOUND_FACTOR`` x the larger of eager's and plain
``torch.compile``'s on the same model and inputs, plus a floor of two unit roundoffs of the dtype
(``benchmarks/zoo.py`` says why), and kopt must have run its rewritten graph: a fallback, a skipped
pass or a model with no rewritten graph fails, unless ``KNOWN`` lists it with its reason (then the
case is an explicit xfail that says why). Set ``KOPT_ZOO_RESULTS=DIR`` to also write the table
(``zoo-cpu.{json,md}``) that ``python benchmarks/zoo.py`` writes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from benchmarks.zoo import ZooResult, run_case, write
from kopt.workloads import BUILTIN

# (model, dtype) -> why kopt does not run a rewritten graph there; each is listed in the README
KNOWN: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def zoo_results():
    """Every case's result; written as the results table at the end when ``KOPT_ZOO_RESULTS`` is set."""
    results: list[ZooResult] = []
    start = time.perf_counter()
    yield results
    out = os.environ.get("KOPT_ZOO_RESULTS")
    if out and results:
        write(results, Path(out), None, time.perf_counter() - start)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", list(BUILTIN))
def test_kopt_is_as_accurate_as_eager_and_torch_compile(name, dtype, zoo_results, record_property):
    """kopt's error against float64 is within 1.5x eager's / torch.compile's (+ floor), and the
    rewritten graph ran."""
    result = run_case(name, dtype)
    zoo_results.append(result)
    record_property("passes_fired", result.passes_fired)
    record_property("rel_err", dict(eager=result.rel_err_eager, torch_compile=result.rel_err_torch_compile,
                                    kopt=result.rel_err_kopt))
    print(f"{name} {dtype}: rel err eager {result.rel_err_eager:.2e}, torch.compile "
          f"{result.rel_err_torch_compile:.2e}, kopt {result.rel_err_kopt:.2e} (bound {result.bound:.2e}); "
          f"fired {result.passes_fired}")
    assert result.within_bound, (
        f"kopt rel err {result.rel_err_kopt:.3e} > bound {result.bound:.3e} (eager {result.rel_err_eager:.3e}, "
        f"torch.compile {result.rel_err_torch_compile:.3e}); fired {result.passes_fired}")
    if result.problems and (name, dtype) in KNOWN:
        pytest.xfail(f"{KNOWN[name, dtype]} (report: {'; '.join(result.problems)})")
    assert not result.problems, "; ".join(result.problems)
