"""Search proposals of pipeline choices (:mod:`kopt.agent.pipeline_choice`), per captured graph.

For each graph, relative to ``passes="auto"`` (the base every choice records):

* each opt-in pass added at its documented position: right before its ``runs_before`` pass
  (:func:`kopt.passes.pipeline.with_pass`; ``staging`` for most); the FP8 passes are not proposed
  on their own (``fp8=...`` adds them with their producer fusions);
* each default pass left out (not ``staging``, which the compile's split and hoisting rely on);
* each attention shape on each other backend the device offers (:mod:`kopt.agent.sdpa_backend`);
* where an FP8 config is given, the FP8 pipeline at each scale granularity
  (:func:`kopt.passes.pipeline.fp8_pipeline` for the default list, else ``resolve(list, fp8)``; the
  pass options recorded as JSON), then at the config's granularity on each group of the graph's
  linears alone (:mod:`kopt.agent.fp8_groups`);
* on a GPU, the graph lowered with Inductor's tuning (:data:`LOWERING_TUNING`): its GEMMs autotuned
  among Inductor's Triton templates and cuBLAS at their exact shapes, and its generated kernels'
  launch configs tuned by coordinate descent. GEMMs and attention are 85 % of a DiT's kernel time and
  cuBLAS's heuristic picks one kernel per shape without timing it; both tunings lengthen the cold
  compile (Inductor caches what they chose) and are kept only for a measured end-to-end gain.

Deterministic: graphs in capture order; within a graph opt-ins, then attention, then lowering, then
FP8, then leave-outs, each in pipeline order. Leave-outs come last because they are the least likely to pay
(each default pass is in the pipeline because it pays in general), and attention choices early
because the loop settles most of them in seconds (:mod:`kopt.agent.sdpa_micro`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from typing import Any

from kopt.agent.candidate import Candidate
from kopt.agent.pipeline_choice import SDPA, PipelineChoice, fp8_options, to_candidate

LOWERING_TUNING = (  # (Inductor config patches, the change in words)
    ({"max_autotune_gemm": True}, "tune GEMMs (Inductor max_autotune_gemm)"),
    ({"coordinate_descent_tuning": True}, "tune generated kernels (Inductor coordinate_descent_tuning)"),
)


def base_pipeline() -> tuple[str, ...]:
    from kopt.passes.pipeline import default_pipeline

    return tuple(p.name for p in default_pipeline())


def _before_staging(names: Sequence[str], added: Sequence[str]) -> tuple[str, ...]:
    at = names.index("staging") if "staging" in names else len(names)
    return (*names[:at], *added, *names[at:])


def pass_choices(base: Sequence[str]) -> list[PipelineChoice]:
    """Opt-in passes added and default passes left out (graph-independent)."""
    return added_passes(base) + left_out_passes(base)


def added_passes(base: Sequence[str]) -> list[PipelineChoice]:
    """Each non-FP8 opt-in pass added where it runs (:func:`kopt.passes.pipeline.with_pass`)."""
    from kopt.passes.pipeline import added_by_name, with_pass

    base = tuple(base)
    return [PipelineChoice(with_pass(base, name), base, change=f"add {name}")
            for name in added_by_name() if name not in base]


def left_out_passes(base: Sequence[str]) -> list[PipelineChoice]:
    """Each default pass but staging left out."""
    base = tuple(base)
    return [PipelineChoice(tuple(n for n in base if n != name), base, change=f"drop {name}")
            for name in base if name != "staging"]


def attention_choices(graph_module: Any, base: Sequence[str], device: str) -> list[PipelineChoice]:
    """Each rewritable attention shape on each other backend ``device`` offers."""
    from kopt.agent.sdpa_backend import DEVICE_BACKENDS, attention_shapes

    choices = []
    for shape, current in attention_shapes(graph_module).items():
        for backend in DEVICE_BACKENDS.get(device, ()):
            if backend != current:
                choices.append(PipelineChoice(_before_staging(tuple(base), [SDPA]), tuple(base),
                                              sdpa=((shape, backend),), change=f"attention {shape} on {backend}"))
    return choices


def lowering_choices(base: Sequence[str], device: str) -> list[PipelineChoice]:
    """The base passes, lowered with each of Inductor's tunings (on a GPU: on the CPU they tune C++)."""
    if not device.startswith("cuda"):
        return []
    return [PipelineChoice(tuple(base), tuple(base), change=change,
                           inductor=tuple(sorted((k, json.dumps(v)) for k, v in patches.items())))
            for patches, change in LOWERING_TUNING]


def fp8_choices(base: Sequence[str], fp8: Any, graph_module: Any = None, layers: int | None = None
                ) -> list[PipelineChoice]:
    """The FP8 pipeline of ``fp8`` (an :class:`kopt.fp8.config.Fp8Config`) at each granularity and,
    when the config leaves attention in bf16, at its own granularity with FP8 attention too: the
    config is the user's contract (its quality gate), and each choice is judged against it, so the
    agent may run attention in FP8 only where the model's output still meets it. Given the graph,
    also FP8 at the config's granularity on each group of its linears alone, largest first, where it
    has two groups or more (:mod:`kopt.agent.fp8_groups`: the loop tries them only after FP8 on all
    of them missed the model's output contract). ``layers``: the number of repeated blocks, when the
    graph is the model's one block class: then each group also in the middle layers only
    (:func:`kopt.agent.fp8_groups.layer_spans`)."""
    from kopt.agent.fp8_groups import group_changes, group_options, layer_spans, linear_groups, narrowed, span_change
    from kopt.fp8.config import Granularity
    from kopt.passes.pipeline import default_pipeline, fp8_pipeline, resolve

    auto = tuple(base) == tuple(p.name for p in default_pipeline())
    configs = [(dataclasses.replace(fp8, granularity=g), f"fp8 {g.value} scales", False) for g in Granularity]
    if not fp8.attention:
        configs.append((dataclasses.replace(fp8, attention=True),
                        f"fp8 {Granularity(fp8.granularity).value} scales + fp8 attention", False))
    groups = linear_groups(graph_module, fp8) if graph_module is not None else []
    if len(groups) >= 2:
        granularity = Granularity(fp8.granularity).value
        configs += [(narrowed(fp8, group), change, True) for group, change in group_changes(groups, granularity)]
        configs += [(dataclasses.replace(narrowed(fp8, group), blocks=span),
                     span_change(group, granularity, span, layers), True)
                    for group in groups for span in layer_spans(layers or 0)]
    choices = []
    for config, change, group in configs:
        passes = fp8_pipeline(config) if auto else resolve(list(base), config)
        options = group_options(fp8_options(config)) if group else fp8_options(config)
        encoded = json.dumps(options, sort_keys=True)
        with_options = tuple((p.name, encoded) for p in passes if p.name in ("fp8-linear", "fp8-attention"))
        choices.append(PipelineChoice(tuple(p.name for p in passes), tuple(base), with_options, change=change))
    return choices


def propose_pipelines(graphs: Sequence[Any], *, device: str = "cpu", fp8: Any = None) -> Iterator[Candidate]:
    """Pipeline-choice candidates for every graph (module docstring)."""
    base = base_pipeline()
    repeated = [g for g in graphs if g.calls > 1]  # one block class: a block's position is its layer
    for graph in graphs:
        choices = added_passes(base) + attention_choices(graph.graph_module, base, device)
        choices += lowering_choices(base, device)
        if fp8 is not None:
            layers = graph.calls if len(repeated) == 1 and repeated[0] is graph else None
            choices += fp8_choices(base, fp8, graph.graph_module, layers)
        choices += left_out_passes(base)
        for choice in choices:
            yield to_candidate(graph.signature, choice)
