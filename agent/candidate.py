"""A candidate: a proposed replacement for one region, as Python source, with the contract it claims.

Candidates are untrusted code (a proposer or an LLM wrote them); nothing in this module runs them.
The verifier (:mod:`kopt.agent.verify`) does, in a sandboxed child process; the knowledge base
stores them by :attr:`Candidate.content_hash`, so the same proposal is never evaluated as new twice.

The source defines ``entry_point`` taking the region's inputs in canonical order (see
:mod:`kopt.agent.region`) and either returning its outputs (``Convention.RETURNS``: a tensor or a
tuple of tensors in canonical output order) or writing them into ``out=`` buffers the caller
provides (``Convention.OUT``; the buffers have the original outputs' shapes, dtypes and strides).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import re
from collections.abc import Mapping

from kopt.passes.base import Contract, ContractKind

Param = str | int | float | bool


class CandidateKind(enum.Enum):
    """What a proposer changed to produce the candidate (issue 19's four kinds, plus the original)."""

    ORIGINAL = "original"  # the region's own source: the baseline every candidate is compared with
    PASS_CHOICE = "pass-choice"  # a choice within existing passes (opt-in on/off, FP8 granularity, backend)
    CODEGEN_VARIANT = "codegen-variant"  # a kopt.codegen fusion with other kernel parameters
    RULE_BY_EXAMPLE = "rule-by-example"  # a new rewrite rule: pattern fn + replacement fn
    TRITON_KERNEL = "triton-kernel"  # a new Triton kernel for the region


class Convention(enum.Enum):
    """How the candidate hands back its outputs."""

    RETURNS = "returns"  # fn(*inputs) -> tensor | tuple[tensor, ...]
    OUT = "out"  # fn(*inputs, out=(buffers...)) -> None


def contract_to_dict(contract: Contract) -> dict:
    return {"kind": contract.kind.value, "rel_tol": contract.rel_tol, "min_cosine": contract.min_cosine}


def contract_from_dict(data: Mapping) -> Contract:
    return Contract(ContractKind(data["kind"]), rel_tol=float(data["rel_tol"]), min_cosine=float(data["min_cosine"]))


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SIGNATURE = re.compile(r"^[0-9a-f]{64}$")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A proposed replacement for the region with signature ``region_signature``.

    Attributes:
        region_signature: the :attr:`kopt.agent.region.Region.signature` it replaces.
        kind: what kind of change it is.
        source: Python source defining ``entry_point``.
        contract: the numeric promise it makes against the original region.
        entry_point: the function to call.
        convention: returns its outputs, or writes into ``out=`` buffers.
        why: one line: why it computes what the region computes.
        origin: who proposed it (``search``, ``llm:<model>``, ``human``, ``test``).
        shape_specialized: correct only at the region's own shapes (a kernel with the sizes baked
            in); the verifier then tests value edge cases at those shapes only. A region's signature
            includes its shapes, so such a candidate is never applied at other sizes.
        constant_inputs: canonical input indices it treats as fixed after compiling (it may
            precompute from them); it applies only where those inputs have the constant role.
        params: the choices behind it, for the knowledge base and lessons (tile sizes, a pass name).
    """

    region_signature: str
    kind: CandidateKind
    source: str
    contract: Contract
    entry_point: str = "candidate"
    convention: Convention = Convention.RETURNS
    why: str = ""
    origin: str = ""
    shape_specialized: bool = False
    constant_inputs: tuple[int, ...] = ()
    params: tuple[tuple[str, Param], ...] = ()

    def __post_init__(self) -> None:
        if not _SIGNATURE.match(self.region_signature):
            raise ValueError(f"region_signature must be 64 hex digits, got {self.region_signature!r}")
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError("a candidate needs source code")
        if not _IDENTIFIER.match(self.entry_point):
            raise ValueError(f"entry_point must be a Python identifier, got {self.entry_point!r}")
        if any(not isinstance(i, int) or i < 0 for i in self.constant_inputs):
            raise ValueError(f"constant_inputs must be input indices, got {self.constant_inputs!r}")
        for key, value in self.params:
            if not isinstance(key, str) or not isinstance(value, (str, int, float, bool)):
                raise ValueError(f"params must be (name, str|int|float|bool) pairs, got {(key, value)!r}")

    def to_dict(self) -> dict:
        return {"region_signature": self.region_signature, "kind": self.kind.value, "source": self.source,
                "contract": contract_to_dict(self.contract), "entry_point": self.entry_point,
                "convention": self.convention.value, "why": self.why, "origin": self.origin,
                "shape_specialized": self.shape_specialized, "constant_inputs": list(self.constant_inputs),
                "params": [list(p) for p in self.params]}

    @staticmethod
    def from_dict(data: Mapping) -> Candidate:
        return Candidate(data["region_signature"], CandidateKind(data["kind"]), data["source"],
                         contract_from_dict(data["contract"]), data["entry_point"], Convention(data["convention"]),
                         data.get("why", ""), data.get("origin", ""), bool(data.get("shape_specialized", False)),
                         tuple(data.get("constant_inputs", ())), tuple((k, v) for k, v in data.get("params", ())))

    @property
    def content_hash(self) -> str:
        """SHA-256 of everything that defines the proposal (canonical JSON): equal hashes, same candidate."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def original_candidate(region: object, contract: Contract | None = None) -> Candidate:
    """The region itself as a candidate (its ATen source): the baseline for timing, and a sanity
    check of the verifier (the original must always be accepted)."""
    return Candidate(region.signature, CandidateKind.ORIGINAL, region.source, contract or Contract.exact(),
                     entry_point="region", why="the region itself", origin="kopt")


def lowered_original_candidate(region: object, backend: str = "inductor") -> Candidate:
    """The region as ``torch.compile`` lowers it (its ATen source compiled with ``backend``): what the
    region costs in a model that Inductor lowers, where a candidate has to beat Inductor's own fusion
    of it, not the region run op by op. Contract: tolerance 1e-2, since Inductor computes a fused
    chain in float32 and rounds once where the ops round each result."""
    source = (f"{region.source}\n\nimport torch as _kopt_torch\n\n_kopt_eager_region = region\n"
              f"region = _kopt_torch.compile(_kopt_eager_region, backend={backend!r}, fullgraph=True, "
              f"dynamic=False)\n")
    return Candidate(region.signature, CandidateKind.ORIGINAL, source, Contract.tolerance(1e-2),
                     entry_point="region", why=f"the region as torch.compile ({backend}) lowers it", origin="kopt",
                     params=(("lowered", backend),))
