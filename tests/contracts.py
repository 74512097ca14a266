"""Checking a compiled model's output against what the passes that fired promise.

A pass's contract is the whole promise: ``exact`` passes are bit-identical to the original graph,
``tolerance`` and ``quality`` passes only bound the relative error. So an output is compared with eager
bit for bit only when every pass that fired is exact; otherwise its relative error against a float64
copy of the same weights must lie within the combined bound (eager float32 is itself ~1e-7 away from
that reference, and a host's BLAS may round a rewritten GEMM differently from the original one).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

import kopt
from kopt.passes.base import Contract, ContractKind
from kopt.passes.pipeline import available_passes
from tests.conftest import rel_err


def fired_contract(report: kopt.Report, passes: list[kopt.Pass] | None = None) -> Contract:
    """The combined contract of every pass that fired in any graph of ``report`` (exact if none did).
    ``passes``: the pass objects of a user's pipeline, for passes that are not built in."""
    by_name = {p.name: p for p in [*available_passes().values(), *(passes or [])]}
    contract = Contract.exact()
    for graph in report.graphs:
        for record in graph.passes:
            if record.total_matches:
                contract = contract.combine(by_name[record.name].contract)
    return contract


def float64_output(model: torch.nn.Module, inputs: Mapping[str, Any]) -> torch.Tensor:
    """The first output of a float64 copy of ``model`` on ``inputs`` (floating tensors cast to float64)."""
    wide = copy.deepcopy(model).double()
    cast = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        return wide(**cast)[0]


def assert_within_contract(output: torch.Tensor, *, eager: torch.Tensor, float64: torch.Tensor,
                           report: kopt.Report, passes: list[kopt.Pass] | None = None) -> None:
    """``output`` keeps the promise of the passes that fired (see the module docstring)."""
    contract = fired_contract(report, passes)
    if contract.kind is ContractKind.EXACT:
        assert torch.equal(output, eager), f"only exact passes fired, yet rel err {rel_err(output, eager):.2e}"
        return
    error = rel_err(output, float64)
    assert error <= contract.rel_tol, f"rel err {error:.2e} against float64 exceeds {contract.describe()}"
