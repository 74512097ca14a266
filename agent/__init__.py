"""kopt.agent: profile → propose → verify → benchmark → remember. Packaged as ``kopt.agent``.

What exists today (the foundations the loop builds on; none needs a GPU):

* :mod:`.region` — a region: an FX subgraph of a captured graph in canonical form, with typed
  inputs/outputs, a :attr:`~.region.Region.signature` (same computation, shapes, dtypes and layout
  in any model) and a :attr:`~.region.Region.class_key` (the same at any sizes).
  ``region.extract(gm, nodes)``, ``region.fusible_regions(gm)``, ``region.from_function(fn, *x)``,
  ``region.from_source(text, specs)``.
* :mod:`.candidate` — a proposed replacement: kind, Python source, numeric contract, content hash.
* :mod:`.verify` — the sandboxed verifier: ``verify(region, candidate) -> Verdict`` and
  ``time_candidate(region, candidate) -> (Timing, checks)``.
* :mod:`.kb` — the SQLite knowledge base (``kopt kb list|show|export|import|prune``).

The loop (issue 19), each stage its own module:

* :mod:`.graphs` — the model's captured graphs after ``passes="auto"`` minus staging, with real inputs.
* :mod:`.profile` and :mod:`.floor` — time per region (torch.profiler, ``record_function`` per region;
  device time on a GPU, CPU time on the CPU), its roofline floor, ranking by (time − floor) × count.
* :mod:`.propose.search` — offline: generated kernels per region with launch variants (codegen).
  :mod:`.propose.pipeline` — offline: pipeline choices per graph (:mod:`.pipeline_choice`): each
  opt-in pass added, each default pass left out, each attention shape on another SDPA backend
  (:mod:`.sdpa_backend`), the FP8 granularities where an FP8 config is given.
  :mod:`.propose.warm` — orders search proposals by what the KB learned on other models.
  :mod:`.propose.llm` — Claude via the anthropic SDK (tool use), every exchange recorded, replayable.
* :mod:`.apply` — a verified candidate replaces every occurrence of its region (a custom op).
* :mod:`.micro` — a region candidate timed alone first; one not 1% faster than what the region
  runs now is stopped before the end-to-end A/B (a ``slower`` record with the micro numbers).
* :mod:`.bench` — whole-model interleaved A/B, bootstrap CI, quality against the reference; the
  graphs run as FX or lowered by Inductor (``lower="inductor"``: what a GPU user gets);
  :mod:`.cost_model` — the deterministic clock CPU tests ask for by name.
* :mod:`.loop` — ``optimize(model, example_inputs, budget_min=, proposer=, kb_path=, seed=)``,
  resumable from the KB; :mod:`.report` — the table and the PNG plot; :mod:`.cli` — ``kopt optimize``.
* :mod:`.pool` — region candidates verified ahead by a pool of workers (one per GPU locally, the
  timing GPU left out; or Ray tasks) while the loop times the current one, serially.
* :mod:`.auto` — ``kopt.compile(passes="auto")`` applies the KB's wins here, re-verified on first use;
  :mod:`.auto_pipeline` — the same for pipeline choices (another pass list per graph signature).

Not yet: autotune-config candidates of kopt's kernels, FP8 granularity per layer (per graph only),
timing spread over several GPUs (issue 12).
"""

from kopt.agent.candidate import Candidate, CandidateKind, Convention, original_candidate
from kopt.agent.region import Region, TensorSpec, extract, from_function, from_graph, from_source, fusible_regions

__all__ = ["Candidate", "CandidateKind", "Convention", "Region", "TensorSpec", "extract", "from_function", "from_graph",
           "from_source", "fusible_regions", "optimize", "original_candidate"]


def optimize(model, example_inputs, **options):  # noqa: ANN001, ANN003, ANN201 - documented at the target
    """:func:`kopt.agent.loop.optimize` (imported on first use: the loop pulls in the profiler and verifier)."""
    from kopt.agent.loop import optimize as run

    return run(model, example_inputs, **options)
