"""A pipeline choice: which of kopt's passes run on one captured graph, with which options.

The choices within existing passes (issue 19's first kind): an opt-in pass added, a default pass
left out, an FP8 granularity where an FP8 config is given, an attention backend per shape
(:mod:`kopt.agent.sdpa_backend`), and how Inductor lowers the graph (config patches for it alone:
GEMMs autotuned among its Triton templates and cuBLAS, generated kernels' launch configs tuned by
coordinate descent). A choice records the exact pass list (by name; passes are built
through :mod:`kopt.passes.pipeline` only), the options of the passes that have them, the backend per
attention shape, and ``base``: the pass list it was measured against. It is stored as a
:class:`~kopt.agent.candidate.Candidate` of kind ``pass-choice`` whose ``region_signature`` is the
signature of the whole captured graph *before* any pass (:func:`graph_signature`), so it applies
exactly to graphs that compute the same thing at the same shapes, and whose ``source`` is the
choice as JSON (data, never executed).

Why the check is the model's output, not a region's: a pass list changes the whole graph. The
rewritten graph's outputs, on fresh inputs, are compared with the higher-precision reference of the
graph before the passes (:func:`kopt.reference.run_reference`) within the combined contract of every
pass the choice runs (:meth:`Contract.combine`), by :func:`kopt.verify.compare` (the eager graph's
own error is the budget's base), as :mod:`kopt.agent.bench` does for a region candidate. A choice
that changes the lowering changes no FX node, so its graph is also lowered as it asks and that
lowered graph's outputs are checked the same way (:func:`lowered_output_checks`), within
:data:`LOWERING_CONTRACT` on top of the passes' contract.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kopt.agent.candidate import Candidate, CandidateKind
from kopt.passes.base import Contract, Pass

SDPA = "sdpa-backend"
# Another GEMM kernel or launch config accumulates in float32 too, in another order: one rounding of
# the output dtype apart from Inductor's default lowering, which kopt's lowering check also allows
LOWERING_CONTRACT = Contract.tolerance(1e-2)


@dataclasses.dataclass(frozen=True)
class PipelineChoice:
    """The passes to run on one graph (by name, in order), their options, and attention backends."""

    passes: tuple[str, ...]
    base: tuple[str, ...]
    options: tuple[tuple[str, str], ...] = ()  # pass name -> its options as JSON ({"fp8": {...}})
    sdpa: tuple[tuple[str, str], ...] = ()  # attention shape key -> backend
    change: str = ""  # what differs from ``base``, in words (the KB's lessons and warm starts key on it)
    on_top_of: str = ""  # the changes already kept for this graph that this one was measured on top of
    inductor: tuple[tuple[str, str], ...] = ()  # Inductor config patch -> its value as JSON, for this graph

    def to_dict(self) -> dict:
        data = {"passes": list(self.passes), "base": list(self.base), "options": [list(o) for o in self.options],
                "sdpa": [list(s) for s in self.sdpa], "change": self.change, "on_top_of": self.on_top_of}
        if self.inductor:  # only when set: older choices keep their content hash
            data["inductor"] = [list(i) for i in self.inductor]
        return data

    @staticmethod
    def from_dict(data: Mapping) -> PipelineChoice:
        return PipelineChoice(tuple(data["passes"]), tuple(data["base"]), tuple(tuple(o) for o in data["options"]),
                              tuple(tuple(s) for s in data["sdpa"]), data.get("change", ""), data.get("on_top_of", ""),
                              tuple(tuple(i) for i in data.get("inductor", ())))

    @property
    def inductor_patches(self) -> dict[str, Any]:
        """The Inductor config patches this graph is lowered with (over the compile's own)."""
        return {key: json.loads(value) for key, value in self.inductor}

    def build(self) -> list[Pass]:
        """The passes, instantiated through :func:`kopt.passes.pipeline.available_passes`."""
        from kopt.agent.sdpa_backend import SdpaBackendPass
        from kopt.passes.pipeline import available_passes

        known, options = available_passes(), dict(self.options)
        passes: list[Pass] = []
        for name in self.passes:
            if name == SDPA:
                passes.append(SdpaBackendPass(dict(self.sdpa)))
                continue
            rewrite = known[name]
            if name in options:
                rewrite = type(rewrite)(*_option_arguments(json.loads(options[name])))
            passes.append(rewrite)
        return passes

    def applied_to(self, accepted: PipelineChoice) -> PipelineChoice:
        """This choice's change (against its base) applied to ``accepted``'s pass list: choices for one
        graph compose, so a later proposal is measured on top of what was already kept."""
        dropped = set(self.base) - set(self.passes)
        passes = [n for n in accepted.passes if n not in dropped]
        for k, name in enumerate(self.passes):
            if name in passes or name in self.base:
                continue
            later = [n for n in self.passes[k + 1:] if n in passes]
            at = passes.index(later[0]) if later else len(passes)
            passes.insert(at, name)
        options = {**dict(accepted.options), **dict(self.options)}
        sdpa = {**dict(accepted.sdpa), **dict(self.sdpa)}
        inductor = {**dict(accepted.inductor), **dict(self.inductor)}
        return PipelineChoice(tuple(passes), accepted.base, tuple(sorted(options.items())), tuple(sorted(sdpa.items())),
                              self.change, on_top_of=" + ".join(c for c in (accepted.on_top_of, accepted.change) if c),
                              inductor=tuple(sorted(inductor.items())))

    @property
    def contract(self) -> Contract:
        """The combined contract of every pass the choice runs (and of its lowering, when it patches it)."""
        passes = functools.reduce(Contract.combine, (p.contract for p in self.build()), Contract.exact())
        return passes.combine(LOWERING_CONTRACT) if self.inductor else passes


def fp8_options(config: Any) -> dict:
    """An :class:`kopt.fp8.config.Fp8Config` as JSON-ready options (every field, so the user's
    include/skip patterns and quality gate are kept)."""
    data = dataclasses.asdict(config)
    data["granularity"] = config.granularity.value
    data["include"], data["skip"] = list(config.include), list(config.skip)
    if config.blocks is None:  # absent, not null: choices recorded before the field keep their hash
        del data["blocks"]
    else:
        data["blocks"] = list(config.blocks)
    return {"fp8": data}


def _option_arguments(options: Mapping[str, Any]) -> list[Any]:
    if "fp8" in options:
        from kopt.fp8.config import Fp8Config, QualityGate

        data = dict(options["fp8"])
        if isinstance(data.get("gate"), Mapping):
            data["gate"] = QualityGate(**data["gate"])
        return [Fp8Config(**data)]
    return []


def to_candidate(signature: str, choice: PipelineChoice, *, origin: str = "search", why: str = "") -> Candidate:
    """``choice`` for the graph with ``signature`` as a knowledge-base candidate."""
    return Candidate(signature, CandidateKind.PASS_CHOICE, json.dumps(choice.to_dict(), sort_keys=True),
                     choice.contract, entry_point="pipeline", why=why or choice.change, origin=origin,
                     shape_specialized=True,
                     params=(("change", choice.change),)
                     + ((("on_top_of", choice.on_top_of),) if choice.on_top_of else ()))


def rebased(candidate: Candidate, accepted: Candidate | None) -> Candidate:
    """``candidate`` (a pipeline choice) on top of the choice already accepted for its graph."""
    if accepted is None or accepted.kind is not CandidateKind.PASS_CHOICE:
        return candidate
    mine, kept = from_candidate(candidate), from_candidate(accepted)
    if mine.base != kept.base:
        return candidate
    return to_candidate(candidate.region_signature, mine.applied_to(kept), origin=candidate.origin)


def from_candidate(candidate: Candidate) -> PipelineChoice:
    return PipelineChoice.from_dict(json.loads(candidate.source))


def chain(choice: PipelineChoice) -> str:
    """The changes this choice stands for, in the order they were kept: what a choice measured on top
    of it records as its ``on_top_of`` (:meth:`PipelineChoice.applied_to` joins them the same way)."""
    return " + ".join(c for c in (choice.on_top_of, choice.change) if c)


def best_accepted(records: Sequence[Any]) -> Any | None:
    """The accepted pipeline choice of one graph (``records``: its accepted records, one base) that is
    fastest against the base pass list, or None.

    A choice measured on top of another one was timed against that one, not against the base: its
    end-to-end speedup is relative. So each record counts its own speedup times that of the record
    it was measured on top of (found by :func:`chain`), and so on down to the base; ranking the raw
    speedups would prefer an early, large win over the composite that was measured to beat it. A
    record whose predecessor is missing (rejected since, or from another KB) counts its own speedup."""
    by_chain: dict[str, Any] = {}
    for record in records:
        by_chain.setdefault(chain(from_candidate(Candidate.from_dict(record.candidate))), record)

    def total(record: Any, depth: int) -> float:
        own = record.e2e.median if record.e2e else 1.0
        below = by_chain.get(from_candidate(Candidate.from_dict(record.candidate)).on_top_of)
        if below is None or below is record or depth > len(records):
            return own
        return own * total(below, depth + 1)

    return max(records, key=lambda r: total(r, 0), default=None)


def structural_copy(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of the graph sharing the module's tensors (weights are not duplicated)."""
    graph = torch.fx.Graph()
    graph._codegen = graph_module.graph._codegen
    graph.output(graph.graph_copy(graph_module.graph, {}))
    copy = torch.fx.GraphModule(graph_module, graph)
    copy.meta.update(graph_module.meta)
    return copy


def graph_region(graph_module: torch.fx.GraphModule, *, model: str | None = None) -> Any:
    """The whole graph before any pass as a region (its signature is what a choice is keyed by)."""
    from kopt.agent.region import from_graph

    return from_graph(structural_copy(graph_module), model=model)


def graph_signature(graph_module: torch.fx.GraphModule) -> str:
    return graph_region(graph_module).signature


def run_choice(original: torch.fx.GraphModule, choice: PipelineChoice, graph_index: int = 0,
               *, keep_staging: bool = False) -> torch.fx.GraphModule:
    """A copy of ``original`` (the graph before passes) rewritten by the choice's passes; staging is
    left out unless asked, like :func:`kopt.agent.graphs.passes_before_staging`."""
    from kopt.passes.manager import run_passes

    module = structural_copy(original)
    passes = [p for p in choice.build() if keep_staging or p.name != "staging"]
    run_passes(module, passes, graph_index=graph_index)
    return module


def output_checks(original: torch.fx.GraphModule, rewritten: torch.fx.GraphModule, args: Sequence[Any],
                  contract: Contract, graph_index: int = 0) -> list[dict]:
    """``rewritten``'s outputs on ``args`` vs the higher-precision reference of ``original``."""
    from kopt.reference import run_reference
    from kopt.verify import compare

    with torch.no_grad():
        eager = original(*args)
        got = rewritten(*args)
        reference = run_reference(original, *args)
    return [{"graph": graph_index, "output": c.output, "ok": c.ok, "rel_err": c.rel_err, "cosine": c.cosine,
             "verdict": c.verdict} for c in compare(got, eager, contract, reference=reference)]


def lowered_output_checks(original: torch.fx.GraphModule, rewritten: torch.fx.GraphModule, args: Sequence[Any],
                          contract: Contract, patches: Mapping[str, Any], graph_index: int = 0) -> list[dict]:
    """``rewritten`` lowered by Inductor with ``patches``, its outputs on ``args`` vs the higher-precision
    reference of ``original`` (a choice that changes the lowering changes no FX node)."""
    from kopt.config import Lowering
    from kopt.fx.symbolic import lowering_examples
    from kopt.lower import lower

    with torch.no_grad():
        lowered = lower(structural_copy(rewritten), lowering_examples(rewritten, list(args)), Lowering.INDUCTOR,
                        patches)
    checks = output_checks(original, lowered, args, contract, graph_index)
    return [dict(c, lowered=True) for c in checks]


def random_args(graph_module: torch.fx.GraphModule, seed: int) -> list[Any]:
    """Fresh inputs from the placeholders' metadata (normal floats, small non-negative integers)."""
    generator = torch.Generator().manual_seed(seed)
    args = []
    for node in graph_module.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            args.append(value)
            continue
        shape = tuple(int(s) for s in value.shape)
        if value.is_floating_point():
            sample = torch.randn(shape, generator=generator, dtype=torch.float32)
        elif value.dtype == torch.bool:
            sample = torch.rand(shape, generator=generator) < 0.5
        else:
            sample = torch.randint(0, 4, shape, generator=generator)
        args.append(sample.to(value.dtype).to(value.device))
    return args


def same_pipeline(first: Candidate, second: Candidate) -> bool:
    """Whether two pipeline choices run the same passes with the same options and backends."""
    a, b = from_candidate(first), from_candidate(second)
    return (a.passes, a.options, a.sdpa) == (b.passes, b.options, b.sdpa)
