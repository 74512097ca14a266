"""kopt's passes as an Inductor post-grad custom pass, for engines that own the torch.compile call.

vLLM compiles with its own dynamo backend and lets users add one post-grad pass
(``CompilationConfig.inductor_passes``); any Inductor user can set
``torch._inductor.config.post_grad_custom_post_pass`` to it. The graph it receives is Inductor's
post-grad graph: functional ATen with ``meta["val"]`` on every node, like kopt's own capture, but
with the weights as graph inputs (not frozen constants) and Inductor's decompositions applied. So
only the passes that match activations (not weights) apply here: CSE and the norm / RoPE fusions;
weight-level rewrites (sibling merge, FP8 weights, constant folding) and the step-invariant memo
need :func:`kopt.compile` or the ``kopt`` backend.

Safety: each pass runs under kopt's pass manager, which restores the graph when a pass raises; and
anything else that fails here leaves the graph as Inductor gave it, with the reason in the log, so
an engine never fails to compile because of kopt. ``uuid()`` names kopt's version and the pass list,
so Inductor's FX graph cache keys on it and a cached graph is reused only for the same passes.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kopt.passes.base import Pass
from kopt.passes.manager import run_passes
from kopt.passes.pipeline import resolve
from kopt.report import GraphReport, Report

try:  # torch >= 2.6; the base class Inductor checks (and asks for uuid()) before running a custom pass
    from torch._inductor.custom_graph_pass import CustomGraphPass
except ImportError:  # pragma: no cover - older torch than kopt supports
    CustomGraphPass = object  # type: ignore[assignment,misc]

log = logging.getLogger("kopt")

# Passes that match activations only, in the default pipeline's order (kopt/passes/pipeline.py says why).
POST_GRAD_PASSES = ("redundancy", "fuse-adaln", "fuse-gated-residual", "fuse-qk-norm-rope",
                    "fuse-qk-norm-rope-real", "fuse-joint-attention-input")


def _source_digest() -> str:
    """A digest of kopt's pass and kernel sources: a change of kopt's code is a new cache key."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted([*root.glob("passes/*.py"), *root.glob("fx/**/*.py")]):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _placeholder_values(graph_module: torch.fx.GraphModule) -> list[Any]:
    return [n.meta.get("val") for n in graph_module.graph.nodes if n.op == "placeholder"]


def _restore_fake_mode(graph_module: torch.fx.GraphModule, inputs: list[Any]) -> None:
    """Recompute every node's ``meta["val"]`` in Inductor's fake mode, from the placeholders' values
    as Inductor gave them (``inputs``).

    kopt's pass manager refreshes shapes after a rewrite in a fake mode of its own; Inductor then
    updates changed nodes in *its* mode and refuses to mix the two. Propagating the whole graph again
    from the original placeholder values puts every value back in Inductor's mode, with the same
    symbolic sizes."""
    from torch._guards import detect_fake_mode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = detect_fake_mode([v for v in inputs if isinstance(v, torch.Tensor)])
    if mode is None:
        return
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, inputs, strict=True):
        node.meta["val"] = value
    with mode:
        FakeTensorProp(graph_module, mode=mode).propagate_dont_convert_inputs(*inputs)


class KoptPostGradPass(CustomGraphPass):  # type: ignore[misc,valid-type]
    """Run kopt's activation-level passes on an Inductor post-grad graph; never raise.

    ``report`` collects one :class:`~kopt.report.GraphReport` per graph this pass saw (in this
    process), so a caller can check what fired and read each near miss's reason.
    """

    def __init__(self, passes: Sequence[str | Pass] = POST_GRAD_PASSES) -> None:
        self.pass_spec = list(passes)
        self._passes: list[Pass] | None = None
        self.report = Report()
        self.disabled: str | None = None  # why this pass must not rewrite (set by an engine plugin)
        self._uuid: str | None = None

    @property
    def passes(self) -> list[Pass]:
        if self._passes is None:
            self._passes = resolve(self.pass_spec)
        return self._passes

    def __call__(self, graph: torch.fx.Graph) -> None:
        graph_module = graph.owning_module
        graph_report = GraphReport(index=len(self.report.graphs), inputs=[], lowering="inductor (post-grad pass)")
        self.report.graphs.append(graph_report)
        if self.disabled is not None:
            graph_report.fallback = f"kopt's post-grad pass is off: {self.disabled}"
            log.info("%s", graph_report.fallback)
            return
        if not isinstance(graph_module, torch.fx.GraphModule):
            graph_report.fallback = "the post-grad graph has no owning GraphModule: left as Inductor gave it"
            log.info("kopt post-grad pass: %s", graph_report.fallback)
            return
        inputs = _placeholder_values(graph_module)
        try:
            graph_report.passes = run_passes(graph_module, self.passes, graph_index=graph_report.index)
            if any(record.total_matches for record in graph_report.passes):
                _restore_fake_mode(graph_module, inputs)
            graph.lint()
        except Exception as error:  # noqa: BLE001 - an engine must compile without kopt rather than fail
            graph_report.fallback = f"kopt's post-grad passes failed ({type(error).__name__}: {error})"
            log.warning("kopt post-grad pass: %s; the graph may be partly rewritten by the passes "
                        "that completed before it (each of them checked)", graph_report.fallback)
            return
        fired = {r.name: r.total_matches for r in graph_report.passes if r.total_matches}
        log.info("kopt post-grad pass on graph %d (%d nodes): %s", graph_report.index, len(graph.nodes),
                 fired or "no rewrite matched")

    def __deepcopy__(self, memo: dict[int, Any]) -> KoptPostGradPass:
        """The same pass: engines deep-copy their compile configs (vLLM does), and the report of what
        ran must stay readable where the user named the pass."""
        return self

    def uuid(self) -> Any:
        """Stable across processes for the same kopt sources and pass list (Inductor's cache key)."""
        if self._uuid is None:
            names = ",".join(p if isinstance(p, str) else f"{type(p).__module__}.{type(p).__qualname__}"
                             for p in self.pass_spec)
            self._uuid = f"kopt-post-grad:{names}:{_source_digest()}"
        return self._uuid + (":off" if self.disabled is not None else "")

    def rewrites(self) -> dict[str, int]:
        """Matches per pass, summed over every graph this pass saw."""
        total: dict[str, int] = {}
        for graph in self.report.graphs:
            for record in graph.passes:
                total[record.name] = total.get(record.name, 0) + record.total_matches
        return total

    def why_not(self) -> list[str]:
        """Each pass that matched nothing on any graph, with its near misses' reasons (if any)."""
        rewrites = self.rewrites()
        reasons = []
        for name in (p.name for p in self.passes):
            if rewrites.get(name):
                continue
            misses = [f"{m.rule}: {m.reason}" for g in self.report.graphs for r in g.passes if r.name == name
                      for m in r.near_misses]
            detail = "; ".join(sorted(set(misses))[:5]) if misses else "no candidate in the graph"
            reasons.append(f"{name}: {detail}")
        return reasons
