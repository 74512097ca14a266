"""Moving knowledge between files and forgetting old knowledge: export, import, prune.

Export writes JSON lines: a header, then environments, regions, candidate records and lessons,
each with its content. Import recomputes every record's content hash and refuses a record whose
stored hash does not match (an edited export cannot pass for the original); records already
present (same hash, same signature, same environment key) are skipped, so importing a file twice,
or a file exported from this very database, adds nothing. Everything is imported in one
transaction: a bad line leaves the database as it was.

Prune works on whole proposals: it deletes every evaluation of a candidate (per environment) whose
*newest* evaluation is older than the cutoff and has one of the given statuses (never ``accepted``
unless asked). Deciding by the newest evaluation is what keeps pruning safe: deleting only an old
"slower" re-evaluation would bring back the "accepted" record it superseded. Regions and
environments nothing refers to any more go too. Lessons stay (they are the distilled result); their
evidence links may then say "(pruned)".
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Iterator
from typing import IO

from kopt.agent.kb.records import CandidateRecord, Environment, Lesson, RegionRecord, Status, content_hash
from kopt.agent.kb.store import KnowledgeBase

FORMAT = "kopt-kb"


class CorruptExport(ValueError):
    """A line of an export is not a valid record (bad JSON, unknown type, hash mismatch)."""


def export_lines(kb: KnowledgeBase) -> Iterator[str]:
    """The whole knowledge base as JSON lines (header first; referenced records before referrers)."""
    yield json.dumps({"type": FORMAT, "schema": kb.schema_version, "exported_at": time.time()})
    for environment in kb.environments():
        yield json.dumps({"type": "environment", "key": environment.key, **environment.to_dict()}, sort_keys=True)
    for region in kb.regions():
        yield json.dumps({"type": "region", **region.to_dict()}, sort_keys=True)
    for record in kb.candidates():
        yield json.dumps({"type": "candidate", "record_hash": record.record_hash, "content": record.content()},
                         sort_keys=True)
    for lesson in kb.lessons():
        yield json.dumps({"type": "lesson", "record_hash": lesson.record_hash, "content": lesson.content()},
                         sort_keys=True)


def export(kb: KnowledgeBase, stream: IO[str]) -> int:
    """Write the export to ``stream``; returns the number of records written."""
    lines = 0
    for line in export_lines(kb):
        stream.write(line + "\n")
        lines += 1
    return lines - 1  # the header is not a record


@dataclasses.dataclass
class ImportCounts:
    added: dict[str, int] = dataclasses.field(default_factory=dict)
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)

    def note(self, kind: str, added: bool) -> None:
        target = self.added if added else self.skipped
        target[kind] = target.get(kind, 0) + 1

    def __str__(self) -> str:
        kinds = sorted(set(self.added) | set(self.skipped))
        parts = [f"{k}: {self.added.get(k, 0)} added, {self.skipped.get(k, 0)} already present" for k in kinds]
        return ", ".join(parts) or "nothing to import"


def _check_hash(kind: str, stated: str, actual: str, number: int) -> None:
    if stated != actual:
        raise CorruptExport(f"line {number}: {kind} record hash {stated[:12]} does not match its content "
                            f"({actual[:12]}); the export was edited or damaged")


def import_lines(kb: KnowledgeBase, lines: Iterable[str]) -> ImportCounts:
    """Import an export into ``kb`` in one transaction; returns what was added and what was already there."""
    counts = ImportCounts()
    with kb.transaction() as db:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                kind = data["type"]
                if kind == FORMAT:
                    if int(data["schema"]) > kb.schema_version:
                        raise CorruptExport(f"the export has schema {data['schema']}, newer than this kopt's")
                elif kind == "environment":
                    environment = Environment.from_dict(data)
                    _check_hash(kind, data["key"], environment.key, number)
                    counts.note(kind, kb._insert_environment(db, environment, time.time()))
                elif kind == "region":
                    counts.note(kind, kb._insert_region(db, RegionRecord.from_dict(data)))
                elif kind == "candidate":
                    record = CandidateRecord.from_content(data["content"])
                    _check_hash(kind, data["record_hash"], record.record_hash, number)
                    counts.note(kind, kb._insert_candidate(db, record))
                elif kind == "lesson":
                    lesson = Lesson.from_content(data["content"])
                    _check_hash(kind, data["record_hash"], lesson.record_hash, number)
                    counts.note(kind, kb._insert_lesson(db, lesson))
                else:
                    raise CorruptExport(f"line {number}: unknown record type {kind!r}")
            except (KeyError, TypeError, ValueError) as error:
                if isinstance(error, CorruptExport):
                    raise
                raise CorruptExport(f"line {number}: not a valid record ({type(error).__name__}: {error})") from error
            except Exception as error:  # sqlite3.IntegrityError: a record whose region or environment is missing
                raise CorruptExport(f"line {number}: {error}") from error
    return counts


@dataclasses.dataclass(frozen=True)
class PrunePlan:
    """What a prune deletes (or would, in a dry run)."""

    candidates: tuple[CandidateRecord, ...]
    regions: tuple[str, ...]
    environments: tuple[str, ...]

    def __str__(self) -> str:
        return (f"{len(self.candidates)} candidate records, {len(self.regions)} regions, "
                f"{len(self.environments)} environments")


DEFAULT_PRUNE = (Status.REJECTED, Status.ERROR, Status.SLOWER)


def prune(kb: KnowledgeBase, *, older_than_days: float, statuses: Iterable[Status] = DEFAULT_PRUNE,
          dry_run: bool = False, now: float | None = None) -> PrunePlan:
    """Delete the evaluations of every proposal whose newest evaluation is older than
    ``older_than_days`` with a status in ``statuses``, then the regions and environments nothing refers
    to any more. ``dry_run`` only reports."""
    cutoff = (time.time() if now is None else now) - older_than_days * 86400.0
    wanted = {Status(s).value for s in statuses}
    with kb.transaction() as db:
        rows = db.execute("SELECT id, content, candidate_hash, environment_key, status, created_at FROM candidates "
                          "ORDER BY created_at, id").fetchall()
        newest = {}
        for row in rows:
            newest[(row[2], row[3])] = row
        proposals = {key for key, row in newest.items() if row[5] < cutoff and row[4] in wanted}
        doomed = tuple(CandidateRecord.from_content(json.loads(row[1]), row[0]) for row in rows
                       if (row[2], row[3]) in proposals)
        ids = [r.id for r in doomed]
        keep_regions = "SELECT region_signature FROM candidates" + (
            f" WHERE id NOT IN ({','.join('?' * len(ids))})" if ids else "")
        regions = tuple(r[0] for r in db.execute(
            f"SELECT signature FROM regions WHERE created_at < ? AND signature NOT IN ({keep_regions}) "
            "AND signature NOT IN (SELECT region_signature FROM lessons WHERE region_signature IS NOT NULL)",
            (cutoff, *ids)))
        keep_envs = "SELECT environment_key FROM candidates" + (
            f" WHERE id NOT IN ({','.join('?' * len(ids))})" if ids else "")
        environments = tuple(r[0] for r in db.execute(
            f"SELECT key FROM environments WHERE created_at < ? AND key NOT IN ({keep_envs}) "
            "AND key NOT IN (SELECT environment_key FROM lessons WHERE environment_key IS NOT NULL)", (cutoff, *ids)))
        if not dry_run:
            db.executemany("DELETE FROM candidates WHERE id = ?", [(i,) for i in ids])
            db.executemany("DELETE FROM regions WHERE signature = ?", [(s,) for s in regions])
            db.executemany("DELETE FROM environments WHERE key = ?", [(k,) for k in environments])
    return PrunePlan(doomed, regions, environments)


__all__ = ["CorruptExport", "ImportCounts", "PrunePlan", "content_hash", "export", "export_lines", "import_lines",
           "prune"]
