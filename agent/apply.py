"""Put candidates into a graph: each occurrence of a region is replaced by one call of its candidate.

A candidate becomes a torch custom op ``kopt_agent::c_<hash>`` (``Tensor[] -> Tensor[]``) with a
fake implementation from the region's output specs, so the rewritten graph can be traced, run as
FX or lowered by Inductor. Its source runs in this process: only candidates that passed the
sandboxed verifier (:mod:`kopt.agent.verify`) may be applied, which is the callers' rule
(:mod:`kopt.agent.loop`, :mod:`kopt.agent.auto`).

Why a replacement is valid: the candidate was verified against the region with this signature, and a
signature fixes the computation, the shapes, the dtypes and the input strides; the occurrence's
canonical inputs (``Region.input_nodes``) are exactly the candidate's. The outputs' strides are not
fixed by it: canonical form orders the operands of commutative ops, and an elementwise op's output
takes the layout of its operands in order, so the canonical region (what the candidate was verified
against) can return another layout than the model computes at one occurrence (RoPE's ``q * cos``
against ``cos * q`` with ``q`` transposed), while its recorded output specs (and the op's fake
implementation) carry the model's. Later ops were traced with the model's layout (a
``view`` may need it), so an occurrence is replaced only where the two layouts agree
(:func:`layout_agrees`); elsewhere the region stays as it is.
"""

from __future__ import annotations

import importlib.util
import operator
import os
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from kopt.agent.candidate import Candidate, Convention
from kopt.fx.graph_utils import stamp
from kopt.fx.layout import same_layout
from kopt.passes.base import Contract, Pass, PassContext

_LIBRARY = torch.library.Library("kopt_agent", "FRAGMENT")
_OPS: dict[str, torch._ops.OpOverload] = {}
_LOCK = threading.Lock()
RULE = "kb-candidate"


def load_entry_point(candidate: Candidate) -> Callable[..., Any]:
    """Execute a verified candidate's source and return its entry point."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels run in the interpreter on the CPU

    # From a file, not exec: Triton's @jit reads a kernel's source with inspect, which needs a file.
    # The file is named by content hash and written atomically, so two processes loading the same
    # candidate read the same complete source.
    folder = Path(tempfile.gettempdir()) / "kopt-candidates"
    folder.mkdir(exist_ok=True)
    name = f"kopt_candidate_{candidate.content_hash[:24]}"
    path = folder / f"{name}.py"
    if not path.exists() or path.read_text() != candidate.source:
        scratch = folder / f".{name}.{os.getpid()}.tmp"
        scratch.write_text(candidate.source)
        os.replace(scratch, path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, candidate.entry_point)


def candidate_op(candidate: Candidate, outputs: Sequence[Any]) -> torch._ops.OpOverload:
    """The custom op running ``candidate`` (registered once per content hash)."""
    name = f"c_{candidate.content_hash[:24]}"
    with _LOCK:
        if name in _OPS:
            return _OPS[name]
        fn = load_entry_point(candidate)
        specs = list(outputs)

        def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            if candidate.convention is Convention.OUT:
                buffers = [torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device=inputs[0].device)
                           for s in specs]
                fn(*inputs, out=tuple(buffers))
                return buffers
            result = fn(*inputs)
            return list(result) if isinstance(result, (tuple, list)) else [result]

        def fake(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
            return [torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device=inputs[0].device) for s in specs]

        _LIBRARY.define(f"{name}(Tensor[] inputs) -> Tensor[]")
        _LIBRARY.impl(name, run, "CompositeExplicitAutograd")
        torch.library.register_fake(f"kopt_agent::{name}", fake, lib=_LIBRARY)
        _OPS[name] = getattr(torch.ops.kopt_agent, name).default
        return _OPS[name]


def replace_occurrence(graph: torch.fx.Graph, occurrence: Any, candidate: Candidate,
                       replaced: dict[torch.fx.Node, torch.fx.Node]) -> torch.fx.Node:
    """Replace one occurrence's nodes by a call of ``candidate``; returns the call node."""
    region = occurrence.region
    op = candidate_op(candidate, region.outputs)
    members = set(occurrence.members)
    order = {n: i for i, n in enumerate(graph.nodes)}
    readers = [u for out in region.output_nodes for u in out.users if u not in members]
    with graph.inserting_before(min(readers, key=order.__getitem__)):
        inputs = [replaced.get(n, n) for n in region.input_nodes]
        call = graph.call_function(op, (inputs,))
        call.meta["val"] = [out.meta["val"] for out in region.output_nodes]
        stamp(call, pass_name="kb-apply", rule=RULE)
        call.meta["kopt_agent_region"] = region.signature  # the profiler attributes its time to the region
        results = []
        for k, out in enumerate(region.output_nodes):
            item = graph.call_function(operator.getitem, (call, k))
            item.meta["val"] = out.meta["val"]
            results.append(item)
    for out, result in zip(region.output_nodes, results, strict=True):
        out.replace_all_uses_with(result, delete_user_cb=lambda user, inside=members: user not in inside)
        replaced[out] = result
    for node in sorted(members, key=order.__getitem__, reverse=True):
        if not node.users:
            graph.erase_node(node)
    return call


_NATIVE_STRIDES: dict[str, list[tuple[int, ...]]] = {}


def native_strides(region: Any) -> list[tuple[int, ...]]:
    """The strides of what the canonical region returns at its own shapes and input layouts: the
    verifier's own expectation (:func:`kopt.agent.verify.reference.expected_outputs`, a FakeTensor
    run), which a candidate's outputs were held to."""
    from kopt.agent.verify.plan import TrialPlan
    from kopt.agent.verify.reference import expected_outputs

    if region.signature not in _NATIVE_STRIDES:
        layouts = [torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device="meta") for s in region.inputs]
        outputs = expected_outputs(region, TrialPlan((), (), 0), layouts)
        _NATIVE_STRIDES[region.signature] = [tuple(o.stride) for o in outputs]
    return _NATIVE_STRIDES[region.signature]


def layout_agrees(occurrence: Any) -> str:
    """Empty if every output of the model at ``occurrence`` has the layout the canonical region
    returns (what a candidate for it was verified to return), else which output differs."""
    region = occurrence.region
    for k, (node, strides) in enumerate(zip(region.output_nodes, native_strides(region), strict=True)):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and not same_layout(value.shape, value.stride(), strides):
            return (f"output {k} has strides {tuple(value.stride())} here, the canonical region's {strides}: "
                    "later ops were traced with this occurrence's layout")
    return ""


def apply_candidates(graph_module: torch.fx.GraphModule, chosen: Mapping[str, Candidate],
                     ctx: PassContext | None = None) -> int:
    """Replace every occurrence of a region in ``chosen`` (signature -> candidate) whose outputs have
    the region's layout (:func:`layout_agrees`); returns how many were replaced."""
    from kopt.agent.profile import find_occurrences

    count, replaced = 0, {}
    for occurrence in find_occurrences(graph_module):
        candidate = chosen.get(occurrence.region.signature)
        if candidate is None:
            continue
        differs = layout_agrees(occurrence)
        if differs:
            if ctx is not None:
                ctx.decline(RULE, occurrence.region.output_nodes[-1], differs)
            continue
        if ctx is not None and not ctx.fire(RULE, occurrence.region.output_nodes[-1]):
            continue
        replace_occurrence(graph_module.graph, occurrence, candidate, replaced)
        count += 1
    graph_module.graph.lint()
    graph_module.recompile()
    return count


class ApplyCandidates(Pass):
    """A pass applying verified candidates by region signature (the loop's and ``passes="auto"``'s)."""

    name = "kb-apply"
    why = "a verified candidate computes what its region computes, within its contract (kopt.agent.verify)"
    contract = Contract.tolerance(1e-2)

    def __init__(self, chosen: Mapping[str, Candidate], notes: Sequence[str] = ()) -> None:
        self.chosen, self.extra_notes = dict(chosen), list(notes)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        ctx.notes.extend(self.extra_notes)
        if self.chosen:
            count = apply_candidates(graph_module, self.chosen, ctx)
            ctx.notes.append(f"{count} region occurrence(s) replaced by knowledge-base candidates")
