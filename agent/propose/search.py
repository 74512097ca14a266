"""The offline search proposer: choices within what kopt already generates, enumerated, no key needed.

For each ranked region that :mod:`kopt.codegen` can fuse it proposes the generated kernel with
launch variants: the row-block budget (how many elements one program holds: ``BLOCK_R x BLOCK_N``)
and a fixed ``num_warps`` instead of the generator's heuristic. Every variant computes the region
exactly like the generated kernel (same body; only the grid and warps change), so each carries the
``codegen-fuse`` pass's contract (tolerance 1e-2: float32 arithmetic, one rounding per output).

The candidate is self-contained source (torch, triton, math; no kopt import), because the verifier
runs it in a sandbox that cannot read kopt. It wraps the generated ``launch`` in ``candidate(...)``,
which takes the region's canonical inputs (:mod:`kopt.agent.region`) and returns its canonical
outputs; tiny constants that the agent region inlines but codegen reads as inputs are embedded.

The generated launcher checks the rank and broadcast pattern it was traced for, so a candidate is
marked ``shape_specialized``: the verifier tests it at the region's own shapes (a signature fixes
them, so it is never applied at others).

Deterministic: the order is the profile's ranking, the default variant first, the others shuffled
by ``random.Random(seed)``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator, Sequence

import torch

from kopt.agent.candidate import Candidate, CandidateKind
from kopt.codegen.triton_source import generate
from kopt.fx.constants import constant_value
from kopt.passes.base import Contract

ROW_BUDGETS = (512, 1024, 2048, 4096, 8192)  # elements per program (the generator uses 2048)
WARPS = (None, 1, 2, 4, 8)  # None: the generator's heuristic
DEFAULT = (2048, None)
CONTRACT = Contract.tolerance(1e-2)  # the codegen-fuse pass's
_BUDGET_LINE = "    block_r = min(triton.next_power_of_2(rows), max(1, 2048 // block_n))"
_WARPS_LINE = "    num_warps = 4 if block_r * block_n <= 2048 else 8 if block_r * block_n <= 8192 else 16"


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """What the search proposer varies (the defaults are every combination)."""

    row_budgets: tuple[int, ...] = ROW_BUDGETS
    warps: tuple[int | None, ...] = WARPS
    max_per_region: int = 4


def _literal(value: torch.Tensor) -> str:
    values = value.detach().to(torch.float64).flatten().tolist()
    dtype = str(value.dtype).removeprefix("torch.")
    return f"torch.tensor({values!r}, dtype=torch.{dtype}).reshape({tuple(value.shape)!r})"


def candidate_source(occurrence: object, row_budget: int, warps: int | None) -> str | None:
    """The generated kernel for ``occurrence`` with these launch parameters, behind a
    ``candidate(*canonical_inputs)`` wrapper; None when the launch cannot be parameterized."""
    fusible, region = occurrence.fusible, occurrence.region
    source = generate(fusible)
    if _BUDGET_LINE not in source or _WARPS_LINE not in source:
        return None
    source = source.replace(_BUDGET_LINE, _BUDGET_LINE.replace("2048", str(row_budget)))
    if warps is not None:
        source = source.replace(_WARPS_LINE, f"    num_warps = {warps}")
    canonical = {node: i for i, node in enumerate(region.input_nodes)}
    arguments = []
    for node in fusible.input_nodes:
        if node in canonical:
            arguments.append(f"in{canonical[node]}")
            continue
        value = constant_value(node)
        if value is None:
            return None  # an input the agent region does not have: no faithful wrapper
        arguments.append(f"{_literal(value)}.to(in0.device)")
    positions = {node: k for k, node in enumerate(fusible.output_nodes)}
    order = [positions[node] for node in region.output_nodes]
    params = ", ".join(f"in{i}" for i in range(len(region.inputs)))
    wrapper = [
        "",
        "",
        f"def candidate({params}):",
        '    """The region\'s canonical inputs in, its canonical outputs out (the generated kernel)."""',
        f"    outputs = launch({', '.join(arguments)})",
        f"    return tuple(outputs[k] for k in {tuple(order)!r})",
    ]
    return source + "\n".join(wrapper) + "\n"


def variants(space: SearchSpace, seed: int) -> list[tuple[int, int | None]]:
    """Launch parameters to try for one region: the default first, then a seeded sample."""
    others = [(b, w) for b in space.row_budgets for w in space.warps if (b, w) != DEFAULT]
    random.Random(seed).shuffle(others)
    return [DEFAULT, *others][:space.max_per_region]


def propose(occurrence: object, *, seed: int = 0, space: SearchSpace | None = None) -> Iterator[Candidate]:
    """Codegen candidates for one region occurrence (any occurrence of its signature will do)."""
    space = space or SearchSpace()
    region = occurrence.region
    if occurrence.fusible is None:
        return
    for row_budget, warps in variants(space, seed + int(region.signature[:8], 16)):
        source = candidate_source(occurrence, row_budget, warps)
        if source is None:
            return
        params = (("generator", "kopt.codegen"), ("row_budget", row_budget), ("num_warps", warps or "auto"))
        yield Candidate(region.signature, CandidateKind.CODEGEN_VARIANT, source, CONTRACT, why=(
            "the codegen-fuse kernel for this region (float32 arithmetic, one rounding per output) with "
            f"{row_budget} elements per program and {warps or 'heuristic'} warps"), origin="search",
            shape_specialized=True, params=params)


def propose_all(occurrences: Sequence[object], ranked_signatures: Sequence[str], *, seed: int = 0,
                space: SearchSpace | None = None) -> Iterator[Candidate]:
    """Candidates for every ranked region, best-ranked first (one occurrence per signature)."""
    first = {}
    for occurrence in occurrences:
        first.setdefault(occurrence.region.signature, occurrence)
    for signature in ranked_signatures:
        if signature in first:
            yield from propose(first[signature], seed=seed, space=space)
