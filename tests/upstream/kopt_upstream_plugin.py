"""A pytest plugin: diffusers' own torch.compile tests, run on the CPU with kopt as the backend.

Loaded by ``run_diffusers_tests.sh`` (``-p kopt_upstream_plugin``) in a checkout of diffusers'
``tests/`` folder, which the PyPI package does not ship; not part of kopt's CI (it needs that
checkout). What it changes in the upstream run, and nothing else:

* ``torch.compile`` (and so ``nn.Module.compile`` and diffusers' ``compile_repeated_blocks``) gets
  ``backend=$KOPT_UPSTREAM_BACKEND`` (``kopt`` by default; ``inductor`` for the comparison run)
  wherever the test asked for the default backend; ``mode``, ``fullgraph``, ``dynamic`` pass through;
* diffusers' ``require_accelerator`` / ``require_torch_accelerator`` stop skipping, so that the
  compile and LoRA hot-swap mixins run on the CPU (their tests do not need a GPU to mean something);
* with ``KOPT_UPSTREAM_STATIC=1``, the hot-swap tests' ``different_shapes_for_compilation`` is None:
  they then compile with ``dynamic=False`` and compare the output after the swap with the output of
  the second adapter (with shapes given, they only run the shapes and compare nothing).

After each test it records what kopt did (graphs, rewrites that fired, fallbacks, graph breaks) to
``$KOPT_UPSTREAM_REPORT`` (JSON lines) and prints a summary at the end.
"""

from __future__ import annotations

import functools
import json
import os

import pytest
import torch

BACKEND = os.environ.get("KOPT_UPSTREAM_BACKEND", "kopt")
STATIC = os.environ.get("KOPT_UPSTREAM_STATIC", "0") == "1"
REPORT = os.environ.get("KOPT_UPSTREAM_REPORT")
_torch_compile = torch.compile
_records: list[dict] = []


@functools.wraps(_torch_compile)
def _compile_with_backend(*args, **kwargs):
    if kwargs.get("backend", "inductor") == "inductor":
        kwargs["backend"] = BACKEND
    return _torch_compile(*args, **kwargs)


def pytest_configure(config):
    import tests.testing_utils as diffusers_testing  # diffusers' own (the run's rootdir)

    for name in ("require_accelerator", "require_torch_accelerator"):
        setattr(diffusers_testing, name, lambda test: test)
    torch.compile = _compile_with_backend


def pytest_collection_modifyitems(config, items):
    if not STATIC:
        return
    from tests.models.testing_utils import LoraHotSwappingForModelTesterMixin

    for item in items:
        if item.cls is not None and issubclass(item.cls, LoraHotSwappingForModelTesterMixin):
            item.cls.different_shapes_for_compilation = property(lambda self: None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if BACKEND == "kopt":
        from kopt import backend as kopt_backend

        kopt_backend._ENTRY_POINT_BACKENDS.clear()  # one test's compilations in one record
    breaks_before = dict(torch._dynamo.utils.counters.get("graph_break", {}))
    outcome = yield
    breaks = {k: v - breaks_before.get(k, 0) for k, v in torch._dynamo.utils.counters.get("graph_break", {}).items()
              if v > breaks_before.get(k, 0)}
    error = outcome.excinfo[1] if outcome.excinfo else None
    status = "passed" if error is None else "skipped" if isinstance(error, pytest.skip.Exception) else "failed"
    record = dict(test=item.nodeid, status=status, graph_breaks=breaks, graphs=[])
    if BACKEND == "kopt":
        for backend in kopt_backend._ENTRY_POINT_BACKENDS.values():
            for graph in backend.report.graphs:
                record["graphs"].append(dict(
                    lowering=graph.lowering, fallback=graph.fallback,
                    rewrites=sum(p.total_matches for p in graph.passes),
                    fired=sorted({p.name for p in graph.passes if p.total_matches}),
                    rederivations=graph.weight_rederivations, refreshes=graph.weight_refreshes))
    _records.append(record)
    if REPORT:
        with open(REPORT, "a") as handle:
            handle.write(json.dumps(record) + "\n")


def pytest_terminal_summary(terminalreporter):
    if BACKEND != "kopt" or not _records:
        return
    terminalreporter.section(f"kopt as the backend ({'static shapes' if STATIC else 'as written'})")
    for record in _records:
        graphs = record["graphs"]
        fired = sum(1 for g in graphs if g["rewrites"])
        fallbacks = sorted({g["fallback"] for g in graphs if g["fallback"]})
        terminalreporter.write_line(
            f"{record['status'].upper()} {record['test']}: {len(graphs)} graph(s), {fired} with "
            f"rewrites ({sum(g['rewrites'] for g in graphs)} in all), re-derived "
            f"{sum(g['rederivations'] for g in graphs)}x, graph breaks {sum(record['graph_breaks'].values())}"
            + (f"; fallbacks: {fallbacks}" if fallbacks else ""))
