"""Run an ordered list of passes over one captured graph, safely and observably.

Each pass runs on the graph in place; if it raises, the graph is restored from a structural copy
taken before it, the failure is recorded and the next pass runs (``strict=True`` raises instead).
After a pass that rewrote something, the graph is linted and FakeTensor metadata is recomputed, so
the next pass sees correct shapes on every node.

On a graph with symbolic sizes, a pass that makes a decision only some sizes satisfy adds a guard to
dynamo's ShapeEnv (sound: a call with other sizes recompiles), but it also gives up the dynamism the
user asked for. Passes are written to decline instead (:func:`kopt.fx.symbolic.known_equal`); any
guard a pass still adds is named in its record, so a specialization is never silent.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from kopt.fx.graph_utils import census, missing_meta
from kopt.fx.meta_refresh import refresh, signatures
from kopt.fx.symbolic import baked_sizes, guards_since, shape_env_of
from kopt.passes.base import Fuel, Pass, PassContext
from kopt.report import PassRecord

log = logging.getLogger("kopt")  # one line per pass at INFO


class PassFailed(RuntimeError):
    """A pass raised while ``strict=True``."""


def _snapshot(graph: torch.fx.Graph) -> torch.fx.Graph:
    copy = torch.fx.Graph(owning_module=graph.owning_module)
    copy._codegen = graph._codegen
    output = copy.graph_copy(graph, {})
    copy.output(output)
    return copy


def _module_state(graph_module: torch.fx.GraphModule) -> tuple[dict[str, object], dict[str, object]]:
    """The constants the graph's ``get_attr`` nodes may name (a pass adds and deletes some)."""
    return dict(graph_module._buffers), dict(graph_module._parameters)


def _restore_module_state(graph_module: torch.fx.GraphModule,
                          state: tuple[dict[str, object], dict[str, object]]) -> None:
    """Put back the constants a failed pass deleted and drop those it added: the restored graph
    reads exactly the constants it read before the pass."""
    for live, saved in zip((graph_module._buffers, graph_module._parameters), state, strict=True):
        live.clear()
        live.update(saved)


def _dump(trace_dir: Path | None, graph_index: int, stem: str, graph_module: torch.fx.GraphModule) -> None:
    if trace_dir is None:
        return
    folder = trace_dir / f"graph{graph_index}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.txt").write_text(str(graph_module.graph))


def run_passes(graph_module: torch.fx.GraphModule, passes: list[Pass], *, graph_index: int = 0,
               strict: bool = False, fuel: Fuel | None = None,
               trace_dir: Path | None = None) -> list[PassRecord]:
    """Apply ``passes`` in order to ``graph_module``; one :class:`PassRecord` per pass."""
    fuel = fuel or Fuel()
    records = []
    shape_env = shape_env_of(graph_module)
    for position, rewrite in enumerate(passes):
        stem = f"{position:02d}_{rewrite.name}"
        before = census(graph_module.graph)
        saved, saved_state = _snapshot(graph_module.graph), _module_state(graph_module)
        ctx = PassContext(rewrite.name, fuel, trace_dir=trace_dir)
        _dump(trace_dir, graph_index, stem + "_before", graph_module)
        guards = len(shape_env.guards) if shape_env is not None else 0
        start = time.perf_counter()
        unchanged = signatures(graph_module.graph)
        try:
            rewrite.apply(graph_module, ctx)
            graph_module.graph.lint()
            baked = baked_sizes(graph_module.graph) if shape_env is not None else []
            if baked:
                raise RuntimeError(f"the pass wrote sizes of the traced call into {baked[:3]} instead of "
                                   "sym_size nodes: the graph would only be right for that call's sizes")
            graph_module.recompile()
            if ctx.total_matches:
                refresh(graph_module, unchanged)  # metadata of what the pass changed (kopt.fx.meta_refresh)
                unknown = missing_meta(graph_module.graph)
                if unknown:
                    raise RuntimeError(f"no shape metadata on {[n.name for n in unknown[:5]]} after the pass")
            status = "applied" if ctx.total_matches else "no match"
            if not ctx.total_matches and any("fuel" in m.reason for m in ctx.near_misses):
                status = "out of fuel"
        except Exception as error:  # a broken pass must never break the user's model
            if strict:
                raise PassFailed(f"pass {rewrite.name!r} raised: {error}") from error
            graph_module.graph = saved
            _restore_module_state(graph_module, saved_state)
            graph_module.recompile()
            status = f"skipped: {type(error).__name__}: {error}"
            ctx.matches.clear()
            ctx.notes.clear()
        seconds = time.perf_counter() - start
        specialized = guards_since(shape_env, guards)
        if specialized:
            ctx.notes.append(f"specialized the graph on sizes ({'; '.join(specialized[:5])}): a call with sizes "
                             "outside these recompiles")
        log.info("graph %d: %s %s (%d matches) in %.1f s", graph_index, rewrite.name, status, ctx.total_matches,
                 seconds)
        _dump(trace_dir, graph_index, stem + "_after", graph_module)
        record = PassRecord(rewrite.name, rewrite.why, rewrite.contract.describe(), status,
                            dict(ctx.matches), list(ctx.near_misses), before,
                            census(graph_module.graph), seconds, list(ctx.notes))
        records.append(record)
        if trace_dir is not None:
            stats = {"matches": record.matches, "near_misses": [m.__dict__ for m in record.near_misses],
                     "status": status, "seconds": seconds}
            (trace_dir / f"graph{graph_index}" / f"{stem}_stats.json").write_text(json.dumps(stats, indent=1))
    return records
