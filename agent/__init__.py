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

Still to come (issue 19): the profiler and floors, the search and LLM proposers, the end-to-end
benchmark, the loop and ``kopt optimize``.
"""

from kopt.agent.candidate import Candidate, CandidateKind, Convention, original_candidate
from kopt.agent.region import Region, TensorSpec, extract, from_function, from_graph, from_source, fusible_regions

__all__ = ["Candidate", "CandidateKind", "Convention", "Region", "TensorSpec", "extract", "from_function", "from_graph",
           "from_source", "fusible_regions", "optimize", "original_candidate"]


def optimize(model, example_inputs, **options):  # noqa: ANN001, ANN003, ANN201 - documented at the target
    """:func:`kopt.agent.loop.optimize` (imported on first use: the loop pulls in the profiler and verifier)."""
    from kopt.agent.loop import optimize as run

    return run(model, example_inputs, **options)
