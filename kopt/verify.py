"""Differential check of a compiled graph's outputs against a higher-precision reference, eager beside.

Three outputs per check, compared per tensor in float64: the candidate ``c`` (the rewritten graph,
or the lowered one), a baseline ``b`` in the model's own precision (eager: the original graph run op
by op; for a lowering, the graph it lowered run op by op), and the reference ``r``: the original
graph computed in higher precision (:mod:`kopt.reference`). ``d(x, y) = ||x - y|| / ||r||``.

Why not against eager alone: eager bf16 is an approximation too. FLUX.1 rounds ``guidance * 1000`` to
bf16 before its sinusoid and Inductor does not, so Inductor is 0.077 away from eager and 7x closer
to fp32 than eager is. A check against eager would call the better result wrong.

The acceptance rules (``e_x = d(x, r)``):

* ``exact`` contract: ``c`` bit-identical to ``b`` (NaN where ``b`` has NaN). The reference numbers
  are reported, not judged: an exact rewrite must not change a single bit.
* ``tolerance(tau)``: ``e_c <= e_b + tau * (1 + e_b)``. Valid because the contract promises that the
  rewrite moves the output by at most ``tau`` relative to eager (``||c - b|| <= tau ||b||``), and
  ``||b|| <= (1 + e_b) ||r||``: by the triangle inequality every output the contract allows passes,
  and so does any output closer to the reference than eager, whatever its distance to eager. An
  output less accurate than eager passes only within the budget its contract states, and the
  verdict says it is less accurate (both numbers are reported).
* ``quality(min_cosine, tau)`` (FP8's gate): the ``tolerance`` rule, and the angle to the reference at
  most eager's angle plus the gate's: ``acos(cos(c, r)) <= acos(cos(b, r)) + acos(min_cosine)``
  (the angle between directions is a metric, so the same triangle argument holds).
* the lowering (:class:`LoweringRule`): ``e_c <= 1.5 e_b + eps(dtype)``, against the graph it lowered
  run op by op. A lowering promises the same math and only rounds differently (fused
  intermediates kept in fp32, reductions reordered), so its error is of the order of the op-by-op
  run's; it may exceed it by half, plus one unit of the output dtype's precision (a correctly
  rounded output is that far off). tests/test_lowering_check.py holds Inductor to it on tiny
  Qwen-Image (fp32, bf16) and FLUX.1 (bf16, where Inductor skips eager's rounding and is the more
  accurate); a dropped term or a perturbation above the rounding noise fails.

Without a reference (:class:`~kopt.reference.ReferenceUnavailable`: e.g. the forward writes into a
bf16 buffer in place), a pass is judged against eager as before (``d(c, b) <= tau``) and the verdict
says so. Relative error, not absolute, so that a graph returning zeros fails (its error is 1); a
NaN or Inf where the baseline is finite always fails.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection
from typing import Any

import torch
import torch.utils._pytree as pytree

from kopt.passes.base import Contract, ContractKind

LOWERING_FACTOR = 1.5


@dataclasses.dataclass(frozen=True)
class Distance:
    """Relative error and cosine similarity of one output against another, in float64."""

    rel_err: float
    cosine: float

    @property
    def angle(self) -> float:
        return math.acos(max(-1.0, min(1.0, self.cosine)))


@dataclasses.dataclass(frozen=True)
class OutputCheck:
    """One output: the candidate, the baseline and eager against the reference, and the verdict.

    ``rel_err`` / ``cosine``: candidate vs the reference (candidate vs baseline when there is none);
    ``baseline_*``: the baseline vs the reference; ``eager_*``: eager vs the reference (the same as
    the baseline for a pass's check); ``*_vs_eager``: candidate vs eager.
    """

    output: int
    rel_err: float
    cosine: float
    ok: bool
    verdict: str
    rel_err_vs_eager: float | None = None
    cosine_vs_eager: float | None = None
    baseline_rel_err: float | None = None
    baseline_cosine: float | None = None
    eager_rel_err: float | None = None
    eager_cosine: float | None = None


def relative_error(candidate: torch.Tensor, reference: torch.Tensor) -> float:
    """``||candidate - reference|| / ||reference||`` in float64 (complex handled as pairs)."""
    return distance(candidate, reference).rel_err


def cosine_similarity(candidate: torch.Tensor, reference: torch.Tensor) -> float:
    return distance(candidate, reference).cosine


CHUNK = 1 << 24  # elements per float64 chunk: 128 MiB per operand


def _flat_real(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    return (torch.view_as_real(tensor) if tensor.is_complex() else tensor).reshape(-1)


def _sums(candidate: torch.Tensor, reference: torch.Tensor) -> tuple[float, float, float, float]:
    """``(||c - r||², ||r||², ||c||², c · r)`` in float64, one chunk at a time on the candidate's device.

    On the device, not the host: an LLM's logits (2048 × 256,000) are 0.5 G values, whose float64
    copies on the host took seconds per distance and tens of seconds per check. In chunks: float64
    copies of a whole output would double a large model's peak memory."""
    c, r = _flat_real(candidate), _flat_real(reference).to(candidate.device)
    if c.numel() != r.numel():
        raise ValueError(f"outputs of {c.numel()} and {r.numel()} values cannot be compared")
    total = torch.zeros(4, dtype=torch.float64, device=c.device)
    for start in range(0, c.numel(), CHUNK):
        a, b = c[start:start + CHUNK].double(), r[start:start + CHUNK].double()
        difference = a - b
        total += torch.stack([difference.dot(difference), b.dot(b), a.dot(a), a.dot(b)])
    squared_error, reference_sq, candidate_sq, product = total.tolist()
    return squared_error, reference_sq, candidate_sq, product


def distance(candidate: torch.Tensor, reference: torch.Tensor) -> Distance:
    """Relative error and cosine of ``candidate`` against ``reference``, from one pass (:func:`_sums`)."""
    squared_error, reference_sq, candidate_sq, product = _sums(candidate, reference)
    if reference_sq == 0.0:
        rel_err = 0.0 if squared_error == 0.0 else math.inf
    else:
        rel_err = math.sqrt(squared_error) / math.sqrt(reference_sq)
    norms = math.sqrt(candidate_sq) * math.sqrt(reference_sq)
    if norms == 0.0:
        cosine = 1.0 if squared_error == 0.0 else 0.0
    else:
        cosine = product / norms
    return Distance(rel_err, cosine)


@dataclasses.dataclass(frozen=True)
class ContractRule:
    """A pass contract measured against the reference (module docstring: tolerance and quality)."""

    contract: Contract

    def bound(self, baseline: Distance) -> float:
        return baseline.rel_err + self.contract.rel_tol * (1 + baseline.rel_err)

    def accepts(self, candidate: Distance, baseline: Distance, dtype: torch.dtype) -> bool:
        if candidate.rel_err > self.bound(baseline):
            return False
        if self.contract.kind is ContractKind.QUALITY:
            return candidate.angle <= baseline.angle + math.acos(self.contract.min_cosine)
        return True

    def describe(self, baseline: Distance, dtype: torch.dtype) -> str:
        text = f"bound {self.bound(baseline):.2e} = eager + {self.contract.rel_tol:g} budget"
        if self.contract.kind is ContractKind.QUALITY:
            text += f"; cos ≥ {math.cos(min(math.pi, baseline.angle + math.acos(self.contract.min_cosine))):.6f}"
        return text

    def accepts_without_reference(self, vs_baseline: Distance) -> bool:
        ok = vs_baseline.rel_err <= self.contract.rel_tol
        return ok and (self.contract.kind is not ContractKind.QUALITY or vs_baseline.cosine >= self.contract.min_cosine)


@dataclasses.dataclass(frozen=True)
class LoweringRule:
    """The lowered graph against the graph it lowered, run op by op (module docstring)."""

    factor: float = LOWERING_FACTOR

    def bound(self, baseline: Distance, dtype: torch.dtype) -> float:
        return self.factor * baseline.rel_err + _eps(dtype)

    def accepts(self, candidate: Distance, baseline: Distance, dtype: torch.dtype) -> bool:
        return candidate.rel_err <= self.bound(baseline, dtype)

    def describe(self, baseline: Distance, dtype: torch.dtype) -> str:
        return f"bound {self.bound(baseline, dtype):.2e} = {self.factor:g}x op-by-op + eps({_dtype_name(dtype)})"


def _eps(dtype: torch.dtype) -> float:
    real = {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)
    return torch.finfo(real).eps if real.is_floating_point else 0.0


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


Rule = ContractRule | LoweringRule


def _mismatch(index: int, candidate: Any, baseline: Any) -> OutputCheck | None:
    """A check for outputs that cannot be compared numerically (or None: compare them)."""
    if not isinstance(baseline, torch.Tensor):
        ok = candidate == baseline
        return OutputCheck(index, 0.0, 1.0, bool(ok), "equal" if ok else f"{candidate!r} != {baseline!r}")
    if not isinstance(candidate, torch.Tensor) or candidate.shape != baseline.shape:
        shape = getattr(candidate, "shape", type(candidate).__name__)
        return OutputCheck(index, math.inf, 0.0, False, f"shape {shape} != {tuple(baseline.shape)}")
    if candidate.dtype != baseline.dtype:
        return OutputCheck(index, math.inf, 0.0, False, f"dtype {candidate.dtype} != {baseline.dtype}")
    if not baseline.is_floating_point() and not baseline.is_complex():
        ok = torch.equal(candidate.cpu(), baseline.cpu())
        return OutputCheck(index, 0.0 if ok else math.inf, 1.0, ok, "equal" if ok else "integer output differs")
    if (~torch.isfinite(candidate) & torch.isfinite(baseline)).any():
        return OutputCheck(index, math.inf, 0.0, False, "NaN/Inf where the original is finite")
    return None


def _check(index: int, candidate: Any, baseline: Any, reference: Any, eager: Any, rule: Rule) -> OutputCheck:
    mismatch = _mismatch(index, candidate, baseline)
    if mismatch is not None:
        return mismatch
    finite = torch.isfinite(baseline)
    identical = torch.equal(candidate[finite], baseline[finite])
    if isinstance(reference, torch.Tensor):
        finite &= torch.isfinite(reference.to(baseline.device))
    if baseline.numel() and not finite.any():  # nothing left to compare: a pass would be vacuous
        return OutputCheck(index, math.inf, 0.0, False, "no value to compare: the original's output (or its "
                                                        "reference) is NaN/Inf everywhere on these inputs")
    c, b = candidate[finite], baseline[finite]
    vs_baseline = distance(c, b)
    e = eager[finite] if isinstance(eager, torch.Tensor) and eager.shape == baseline.shape else b
    vs_eager = distance(c, e)
    exact = isinstance(rule, ContractRule) and rule.contract.kind is ContractKind.EXACT
    if exact:
        ok = identical
        verdict = "bit-identical" if ok else f"not bit-identical (rel {vs_baseline.rel_err:.2e})"
    if not isinstance(reference, torch.Tensor):
        if not exact:
            assert isinstance(rule, ContractRule), "the lowering is only checked against a reference"
            ok = rule.accepts_without_reference(vs_baseline)
            verdict = (f"rel {vs_baseline.rel_err:.2e} vs eager (bound {rule.contract.rel_tol:g}; no "
                       f"higher-precision reference), cos {vs_baseline.cosine:.6f}" + ("" if ok else " VIOLATION"))
        return OutputCheck(index, vs_baseline.rel_err, vs_baseline.cosine, ok, verdict, vs_eager.rel_err,
                           vs_eager.cosine)
    r = reference.to(baseline.device)[finite]
    mine, base, eager_d = distance(c, r), distance(b, r), distance(e, r)
    if not exact:
        ok = rule.accepts(mine, base, baseline.dtype)
        closer = "more" if mine.rel_err < base.rel_err else "less" if mine.rel_err > base.rel_err else "as"
        verdict = (f"rel {mine.rel_err:.2e} vs reference ({closer} accurate than "
                   f"{'eager' if isinstance(rule, ContractRule) else 'op by op'}: {base.rel_err:.2e}; "
                   f"{rule.describe(base, baseline.dtype)}), cos {mine.cosine:.6f}; vs eager rel "
                   f"{vs_eager.rel_err:.2e}" + ("" if ok else " VIOLATION"))
    return OutputCheck(index, mine.rel_err, mine.cosine, ok, verdict, vs_eager.rel_err, vs_eager.cosine,
                       base.rel_err, base.cosine, eager_d.rel_err, eager_d.cosine)


def _undefined(index: int, candidate: Any, baseline: Any) -> OutputCheck:
    """An output whose values no contract covers (uninitialized memory): only its shape and dtype count."""
    if isinstance(candidate, torch.Tensor) and isinstance(baseline, torch.Tensor) and \
            (candidate.shape, candidate.dtype) == (baseline.shape, baseline.dtype):
        return OutputCheck(index, 0.0, 1.0, True, "values not compared: uninitialized memory (an empty tensor "
                                                  "nothing writes); shape and dtype match")
    return _mismatch(index, candidate, baseline) or OutputCheck(index, math.inf, 0.0, False, "not a tensor")


def compare(candidate: Any, baseline: Any, rule: Contract | Rule, reference: Any = None,
            eager: Any = None, undefined: Collection[int] = ()) -> list[OutputCheck]:
    """One :class:`OutputCheck` per leaf of the (matching) output structures.

    ``baseline``: what the rule measures the candidate's accuracy against (eager for a pass's
    contract); ``reference``: the higher-precision outputs (None: judged against the baseline);
    ``eager``: for the ``*_vs_eager`` numbers when the baseline is not eager; ``undefined``: leaves
    that hold uninitialized memory in the original too (:func:`kopt.fx.aliasing.uninitialized_outputs`).
    """
    rule = ContractRule(rule) if isinstance(rule, Contract) else rule
    cand_leaves, base_leaves = pytree.tree_leaves(candidate), pytree.tree_leaves(baseline)
    if len(cand_leaves) != len(base_leaves):
        return [OutputCheck(0, math.inf, 0.0, False,
                            f"{len(cand_leaves)} outputs where the original has {len(base_leaves)}")]
    ref_leaves = pytree.tree_leaves(reference) if reference is not None else [None] * len(base_leaves)
    eager_leaves = pytree.tree_leaves(eager) if eager is not None else [None] * len(base_leaves)
    if len(ref_leaves) != len(base_leaves) or len(eager_leaves) != len(base_leaves):
        raise ValueError("the reference and eager outputs must have the structure of the baseline's")
    return [_undefined(i, c, b) if i in undefined else _check(i, c, b, r, e, rule)
            for i, (c, b, r, e) in enumerate(zip(cand_leaves, base_leaves, ref_leaves, eager_leaves, strict=True))]
