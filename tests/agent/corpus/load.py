"""Read the frozen corpus: each file is one candidate, its docstring says which region it replaces and
what the verifier must answer (``expect: accept``, or the checks that may reject it)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from kopt.agent.candidate import Candidate, CandidateKind, Convention
from kopt.agent.verify import VerifyConfig
from kopt.passes.base import Contract
from tests.agent.corpus.regions import REGIONS

ROOT = Path(__file__).parent
CHECK_NAMES = {"static", "process", "load", "sandbox", "tamper", "runs", "dtype", "shape", "strides", "alias",
               "mutation", "values", "late-write"}


@dataclasses.dataclass(frozen=True)
class Entry:
    path: Path
    region: str
    expect: frozenset[str]  # {"accept"} or the checks allowed to reject it
    candidate: Candidate
    config: VerifyConfig

    @property
    def honest(self) -> bool:
        return self.expect == {"accept"}

    @property
    def family(self) -> str:
        return self.path.parent.name if not self.honest else "honest"


def _contract(text: str) -> Contract:
    kind, *numbers = text.split()
    if kind == "exact":
        return Contract.exact()
    if kind == "tolerance":
        return Contract.tolerance(float(numbers[0]))
    return Contract.quality(min_cosine=float(numbers[0]), rel_tol=float(numbers[1]))


def load(path: Path, built: dict, base: VerifyConfig) -> Entry:
    source = path.read_text()
    header = ast.get_docstring(ast.parse(source)) or ""
    meta = {}
    for line in header.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().isidentifier() and key.strip() == key.strip().lower():
            meta.setdefault(key.strip(), value.strip())
    spec = REGIONS[meta["region"]]
    if meta["region"] not in built:
        built[meta["region"]] = spec.build()
    region = built[meta["region"]]
    expect = frozenset(e.strip() for e in meta["expect"].split(","))
    unknown = expect - CHECK_NAMES - {"accept"}
    if unknown:
        raise ValueError(f"{path}: unknown checks {sorted(unknown)}")
    kind = CandidateKind(meta.get("kind", "rule-by-example"))
    candidate = Candidate(region.signature, kind, source,
                          _contract(meta["contract"]) if "contract" in meta else spec.contract,
                          convention=Convention(meta.get("convention", "returns")), why=meta.get("why", ""),
                          origin="test-corpus", shape_specialized=meta.get("shape_specialized") == "true")
    config = dataclasses.replace(base, max_elements=int(meta.get("max_elements", base.max_elements)))
    return Entry(path, meta["region"], expect, candidate, config)


def corpus(base: VerifyConfig) -> tuple[list[Entry], dict]:
    built: dict = {}
    entries = [load(p, built, base) for p in sorted(ROOT.rglob("*.py"))
               if p.parent.name not in ("corpus", "__pycache__") and p.parent != ROOT]
    return entries, built
