"""The knowledge base's records: typed, frozen, and each with a content hash that names it.

A record's hash is SHA-256 of its canonical JSON (sorted keys, links by hash, never by local row
id), so the same record has the same hash in every database: export/import deduplicates on it,
and an edited record cannot pass for the original (import recomputes the hash).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Mapping


def content_hash(data: Mapping) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Status(enum.Enum):
    """Where a candidate's evaluation ended."""

    REJECTED = "rejected"  # failed verification: not a correct replacement
    VERIFIED = "verified"  # passed verification; not benchmarked (yet)
    SLOWER = "slower"  # correct, but not faster (micro or end to end)
    ACCEPTED = "accepted"  # correct and an end-to-end win: passes="auto" may apply it
    ERROR = "error"  # the evaluation itself failed (infrastructure); worth retrying


class Outcome(enum.Enum):
    WORKED = "worked"
    FAILED = "failed"


@dataclasses.dataclass(frozen=True)
class Environment:
    """Where numbers were measured; nothing host-specific (no hostname, no paths)."""

    gpu: str
    driver: str
    cuda: str
    torch: str
    triton: str
    kopt: str
    python: str
    platform: str

    @property
    def key(self) -> str:
        return content_hash(dataclasses.asdict(self))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(data: Mapping) -> Environment:
        return Environment(**{f.name: str(data[f.name]) for f in dataclasses.fields(Environment)})

    def describe(self) -> str:
        return f"{self.gpu} · torch {self.torch} · triton {self.triton} · kopt {self.kopt}"


@dataclasses.dataclass(frozen=True)
class Measurement:
    """A timed quantity with its bootstrap 95% confidence interval.

    Micro benchmarks store the candidate's time per call (``unit="ms"``, ``baseline`` the
    original's); end-to-end ones store the whole model's speedup (``unit="speedup"``) over the model
    with the candidates kept so far, where ``against`` names the one this candidate replaced in its
    own region (its content hash; None: the region ran as the passes leave it)."""

    unit: str
    median: float
    ci_low: float
    ci_high: float
    samples: int
    baseline: float | None = None
    against: str | None = None

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        if self.against is None:  # only when set: records made before it keep their hashes
            del data["against"]
        return data

    @staticmethod
    def from_dict(data: Mapping | None) -> Measurement | None:
        return None if data is None else Measurement(**data)


@dataclasses.dataclass(frozen=True)
class RegionRecord:
    """A region as stored: enough to rebuild it (:func:`kopt.agent.region.from_source`) and to show it."""

    signature: str
    class_key: str
    fx_text: str
    class_text: str
    source: str
    inputs: tuple[dict, ...]
    outputs: tuple[dict, ...]
    first_model: str | None
    created_at: float

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["inputs"], data["outputs"] = list(self.inputs), list(self.outputs)
        return data

    @staticmethod
    def from_dict(data: Mapping) -> RegionRecord:
        return RegionRecord(data["signature"], data["class_key"], data["fx_text"], data["class_text"], data["source"],
                            tuple(data["inputs"]), tuple(data["outputs"]), data.get("first_model"),
                            float(data["created_at"]))


@dataclasses.dataclass(frozen=True)
class CandidateRecord:
    """One evaluation of one candidate on one environment. Immutable: evaluating it again makes a
    new record whose ``supersedes`` names this one.

    Attributes:
        candidate: :meth:`kopt.agent.candidate.Candidate.to_dict` of the proposal.
        candidate_hash: its :attr:`~kopt.agent.candidate.Candidate.content_hash`.
        status, reason: where the evaluation ended, and why.
        verification: the verdict (:meth:`kopt.agent.verify.Verdict.to_dict`), or None if not verified.
        micro, e2e: measurements, when taken.
        supersedes: the record hash of the earlier evaluation this one replaces.
        record_hash: this record's content hash; ``id`` is the local row id (not part of the content).
        seconds: how long the evaluation took in the loop, when recorded (a resumed run's estimate of
            what a candidate of this kind costs before it has timed one itself).
    """

    candidate: dict
    candidate_hash: str
    region_signature: str
    environment_key: str
    status: Status
    reason: str
    verification: dict | None
    micro: Measurement | None
    e2e: Measurement | None
    supersedes: str | None
    created_at: float
    id: int | None = dataclasses.field(default=None, compare=False)
    seconds: float | None = None

    def content(self) -> dict:
        timed = {} if self.seconds is None else {"seconds": self.seconds}  # older records: no key, same hash
        return {**timed, "candidate": self.candidate, "candidate_hash": self.candidate_hash,
                "region_signature": self.region_signature, "environment_key": self.environment_key,
                "status": self.status.value, "reason": self.reason, "verification": self.verification,
                "micro": self.micro.to_dict() if self.micro else None, "e2e": self.e2e.to_dict() if self.e2e else None,
                "supersedes": self.supersedes, "created_at": self.created_at}

    @property
    def record_hash(self) -> str:
        return content_hash(self.content())

    @property
    def kind(self) -> str:
        return self.candidate["kind"]

    @staticmethod
    def from_content(data: Mapping, row_id: int | None = None) -> CandidateRecord:
        return CandidateRecord(data["candidate"], data["candidate_hash"], data["region_signature"],
                               data["environment_key"], Status(data["status"]), data["reason"],
                               data.get("verification"),
                               Measurement.from_dict(data.get("micro")), Measurement.from_dict(data.get("e2e")),
                               data.get("supersedes"), float(data["created_at"]), row_id, data.get("seconds"))


@dataclasses.dataclass(frozen=True)
class Lesson:
    """What worked or failed for a region class, and why, with the evaluations that show it."""

    class_key: str
    outcome: Outcome
    text: str
    evidence: tuple[str, ...]  # candidate record hashes
    region_signature: str | None
    environment_key: str | None
    created_at: float
    id: int | None = dataclasses.field(default=None, compare=False)
    seconds: float | None = None

    def content(self) -> dict:
        timed = {} if self.seconds is None else {"seconds": self.seconds}  # older records: no key, same hash
        return {**timed, "class_key": self.class_key, "outcome": self.outcome.value, "text": self.text,
                "evidence": list(self.evidence), "region_signature": self.region_signature,
                "environment_key": self.environment_key, "created_at": self.created_at}

    @property
    def record_hash(self) -> str:
        return content_hash(self.content())

    @staticmethod
    def from_content(data: Mapping, row_id: int | None = None) -> Lesson:
        return Lesson(data["class_key"], Outcome(data["outcome"]), data["text"], tuple(data["evidence"]),
                      data.get("region_signature"), data.get("environment_key"), float(data["created_at"]), row_id)

