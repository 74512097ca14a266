"""The knowledge base: one SQLite file the agent's runs share, safely, even two at a time.

Why this is safe with concurrent ``kopt optimize`` runs: the file is in WAL mode (readers never
block the writer and see a consistent snapshot); every write is one ``BEGIN IMMEDIATE``
transaction (it takes the write lock up front, so two writers queue instead of deadlocking on a
lock upgrade) and the connection waits up to ``busy_timeout_s`` for the lock; and records are
keyed by content hash with ``INSERT OR IGNORE``, so two runs that record the same thing store it
once.

The default file is ``$KOPT_CACHE_DIR/kb.sqlite`` or ``~/.cache/kopt/kb.sqlite`` (the folder
kopt's autotune and codegen caches use).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from kopt.agent.kb.records import CandidateRecord, Environment, Lesson, Measurement, Outcome, RegionRecord, Status
from kopt.agent.kb.schema import migrate


def _use_wal(db: sqlite3.Connection, timeout_s: float) -> None:
    """Switch the file to WAL. Switching a new file takes an exclusive lock for which SQLite does not
    wait (the busy timeout does not apply), so when two processes open a new knowledge base at once
    one of them got "database is locked" at once; it waits here, as for any other write."""
    deadline, delay = time.monotonic() + timeout_s, 0.002
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 0.1)


ERROR_RETRIES = 2  # failed evaluations of one candidate (ERROR records) after which runs stop retrying it


def default_path() -> Path:
    from kopt.cache_dir import kopt_cache_dir

    return kopt_cache_dir() / "kb.sqlite"


class UnknownRecord(LookupError):
    """No record matches the given id or hash prefix (or more than one does)."""


class KnowledgeBase:
    """Record and query what the agent learned. Open one per process (``with KnowledgeBase() as kb``)."""

    def __init__(self, path: str | Path | None = None, *, busy_timeout_s: float = 60.0) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), timeout=busy_timeout_s, isolation_level=None,
                                   check_same_thread=False)
        self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        _use_wal(self._db, busy_timeout_s)
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.execute("PRAGMA foreign_keys = ON")
        self.schema_version = migrate(self._db)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> KnowledgeBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``): all of it lands, or none of it."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    # -- writing -----------------------------------------------------------------------------------------
    def record_environment(self, environment: Environment | None = None) -> Environment:
        """Store ``environment`` (default: this process's) if new; returns it."""
        if environment is None:
            from kopt.agent.kb.environment import current_environment

            environment = current_environment()
        with self.transaction() as db:
            self._insert_environment(db, environment, time.time())
        return environment

    def _insert_environment(self, db: sqlite3.Connection, environment: Environment, created_at: float) -> bool:
        data = environment.to_dict()
        cursor = db.execute("INSERT OR IGNORE INTO environments (key, gpu, driver, cuda, torch, triton, kopt, python, "
                            "platform, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            (environment.key, *(data[k] for k in ("gpu", "driver", "cuda", "torch", "triton", "kopt",
                                                                 "python", "platform")), created_at))
        return cursor.rowcount > 0

    def record_region(self, region: object, *, model: str | None = None) -> RegionRecord:
        """Store a :class:`kopt.agent.region.Region` if its signature is new (the first model that
        showed it is kept); returns the stored record."""
        record = RegionRecord(region.signature, region.class_key, region.text.exact, region.text.by_class,
                              region.source, tuple(s.to_dict() for s in region.inputs),
                              tuple(s.to_dict() for s in region.outputs), model or region.model, time.time())
        with self.transaction() as db:
            self._insert_region(db, record)
        return self.region(region.signature)

    def _insert_region(self, db: sqlite3.Connection, record: RegionRecord) -> bool:
        cursor = db.execute("INSERT OR IGNORE INTO regions (signature, class_key, fx_text, class_text, source, inputs, "
                            "outputs, first_model, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            (record.signature, record.class_key, record.fx_text, record.class_text, record.source,
                             json.dumps(list(record.inputs)), json.dumps(list(record.outputs)), record.first_model,
                             record.created_at))
        return cursor.rowcount > 0

    def record_candidate(self, candidate: object, *, status: Status, reason: str, verdict: object | None = None,
                         micro: Measurement | None = None, e2e: Measurement | None = None,
                         environment: Environment | None = None, supersedes: CandidateRecord | str | None = None,
                         created_at: float | None = None, seconds: float | None = None) -> CandidateRecord:
        """Store one evaluation of a :class:`kopt.agent.candidate.Candidate`. Its region must be
        recorded first. ``supersedes`` links a re-evaluation to the record it replaces; ``seconds`` is
        how long the evaluation took."""
        if environment is None:
            from kopt.agent.kb.environment import current_environment

            environment = current_environment()
        previous = supersedes.record_hash if isinstance(supersedes, CandidateRecord) else supersedes
        record = CandidateRecord(candidate.to_dict(), candidate.content_hash, candidate.region_signature,
                                 environment.key, Status(status), reason,
                                 verdict.to_dict() if hasattr(verdict, "to_dict") else verdict, micro, e2e, previous,
                                 time.time() if created_at is None else created_at, seconds=seconds)
        with self.transaction() as db:
            if db.execute("SELECT 1 FROM regions WHERE signature = ?", (record.region_signature,)).fetchone() is None:
                raise UnknownRecord(f"region {record.region_signature[:12]} is not in the knowledge base: "
                                    "record_region(region) first")
            self._insert_environment(db, environment, record.created_at)
            self._insert_candidate(db, record)
        return self.candidate(record.record_hash)

    def _insert_candidate(self, db: sqlite3.Connection, record: CandidateRecord) -> bool:
        cursor = db.execute("INSERT OR IGNORE INTO candidates (record_hash, candidate_hash, region_signature, "
                            "environment_key, kind, status, reason, content, supersedes, created_at) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            (record.record_hash, record.candidate_hash, record.region_signature, record.environment_key,
                             record.kind, record.status.value, record.reason, json.dumps(record.content()),
                             record.supersedes, record.created_at))
        return cursor.rowcount > 0

    def record_lesson(self, class_key: str, outcome: Outcome, text: str, *,
                      evidence: Iterable[CandidateRecord | str] = (),
                      region_signature: str | None = None, environment: Environment | None = None,
                      created_at: float | None = None) -> Lesson:
        """Store a lesson for a region class, linking the evaluations that show it."""
        links = tuple(e.record_hash if isinstance(e, CandidateRecord) else e for e in evidence)
        lesson = Lesson(class_key, Outcome(outcome), text, links, region_signature,
                        environment.key if environment else None, time.time() if created_at is None else created_at)
        with self.transaction() as db:
            self._insert_lesson(db, lesson)
        return self.lesson(lesson.record_hash)

    def _insert_lesson(self, db: sqlite3.Connection, lesson: Lesson) -> bool:
        cursor = db.execute("INSERT OR IGNORE INTO lessons (record_hash, class_key, region_signature, outcome, "
                            "content, environment_key, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                            (lesson.record_hash, lesson.class_key, lesson.region_signature, lesson.outcome.value,
                             json.dumps(lesson.content()), lesson.environment_key, lesson.created_at))
        return cursor.rowcount > 0

    # -- reading -----------------------------------------------------------------------------------------
    def region(self, signature: str, *, missing_ok: bool = False) -> RegionRecord | None:
        """The region with this signature (a unique prefix is enough)."""
        rows = self._db.execute("SELECT signature, class_key, fx_text, class_text, source, inputs, outputs, "
                                "first_model, created_at FROM regions WHERE signature LIKE ? || '%' LIMIT 2",
                                (signature,)).fetchall()
        if len(rows) != 1:
            if missing_ok and not rows:
                return None
            raise UnknownRecord(f"{'no' if not rows else 'more than one'} region matches {signature!r}")
        row = rows[0]
        return RegionRecord(row[0], row[1], row[2], row[3], row[4], tuple(json.loads(row[5])),
                            tuple(json.loads(row[6])), row[7], row[8])

    def regions(self, class_key: str | None = None) -> list[RegionRecord]:
        query = "SELECT signature FROM regions" + (" WHERE class_key = ?" if class_key else "") + " ORDER BY created_at"
        return [self.region(r[0]) for r in self._db.execute(query, (class_key,) if class_key else ())]

    def environments(self) -> list[Environment]:
        rows = self._db.execute("SELECT gpu, driver, cuda, torch, triton, kopt, python, platform FROM environments "
                                "ORDER BY created_at").fetchall()
        return [Environment(*row) for row in rows]

    def _candidates(self, where: str = "", args: tuple = (), limit: str = "") -> list[CandidateRecord]:
        rows = self._db.execute(f"SELECT id, content FROM candidates {where} ORDER BY created_at, id {limit}",
                                args).fetchall()
        return [CandidateRecord.from_content(json.loads(content), row_id) for row_id, content in rows]

    def candidate(self, key: str | int) -> CandidateRecord:
        """One candidate record by row id or by a unique prefix of its record hash."""
        found = self._candidates("WHERE id = ?", (int(key),)) if str(key).isdigit() and len(str(key)) < 12 else []
        found = found or self._candidates("WHERE record_hash LIKE ? || '%'", (str(key),), "LIMIT 2")
        if len(found) != 1:
            raise UnknownRecord(f"{'no' if not found else 'more than one'} candidate record matches {key!r}")
        return found[0]

    def candidates(self, *, signature: str | None = None, class_key: str | None = None, status: Status | None = None,
                   environment: Environment | None = None, limit: int | None = None) -> list[CandidateRecord]:
        """Every record (oldest first) matching the filters; signature and class key by prefix."""
        clauses, args = [], []
        if signature:
            clauses.append("region_signature LIKE ? || '%'")
            args.append(signature)
        if class_key:
            clauses.append("region_signature IN (SELECT signature FROM regions WHERE class_key LIKE ? || '%')")
            args.append(class_key)
        if status:
            clauses.append("status = ?")
            args.append(Status(status).value)
        if environment:
            clauses.append("environment_key = ?")
            args.append(environment.key)
        where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
        records = self._candidates(where, tuple(args))
        return records[-limit:] if limit else records

    def evaluation_seconds(self, environment: Environment) -> dict[str, list[float]]:
        """How long the recorded evaluations on ``environment`` took, per candidate kind (records that
        say): what a resumed run expects a kind to cost before it has timed one of its own."""
        found: dict[str, list[float]] = {}
        for record in self.candidates(environment=environment):
            if record.seconds:
                found.setdefault(record.kind, []).append(record.seconds)
        return found

    def latest(self, *, signature: str | None = None, environment: Environment | None = None) -> list[CandidateRecord]:
        """The newest evaluation of each distinct candidate (a re-evaluation replaces the earlier one):
        what a resumed run has already done, and must not do again."""
        newest: dict[tuple[str, str], CandidateRecord] = {}
        for record in self.candidates(signature=signature, environment=environment):
            newest[(record.candidate_hash, record.environment_key)] = record
        return sorted(newest.values(), key=lambda r: (r.created_at, r.id or 0))

    def accepted(self, signature: str, environment: Environment | None = None) -> list[CandidateRecord]:
        """Candidates whose newest evaluation for this exact region (and environment, if given) is an
        accepted end-to-end win, fastest over the base first.

        A candidate measured in place of another accepted one (``e2e.against``) was timed against that
        one, so it counts its own speedup times the other's, down to the base; ranking raw speedups
        would prefer an early, large win over the candidate measured to beat it. One whose incumbent
        is no longer accepted here counts its own speedup alone."""
        found = [r for r in self.latest(signature=signature, environment=environment) if r.status is Status.ACCEPTED
                 and r.region_signature == signature]
        by_hash = {r.candidate_hash: r for r in found}

        def over_base(record: CandidateRecord, seen: frozenset[str]) -> float:
            own = record.e2e.median if record.e2e else 0.0
            below = by_hash.get(record.e2e.against) if record.e2e and record.e2e.against else None
            if below is None or below.candidate_hash in seen:
                return own
            return own * over_base(below, seen | {record.candidate_hash})

        return sorted(found, key=lambda r: -over_base(r, frozenset()))

    def has_evaluated(self, candidate: object, environment: Environment | None = None) -> bool:
        """Whether this proposal (by content hash) was already evaluated (in ``environment``, if given):
        a verdict on it is recorded, or its evaluation failed :data:`ERROR_RETRIES` times. An error is
        the machine's (out of memory, a crashed run) and says nothing of the candidate, so the next run
        tries again, but not forever."""
        where = "WHERE candidate_hash = ?" + (" AND environment_key = ?" if environment else "")
        args = (candidate.content_hash,) + ((environment.key,) if environment else ())
        decided = self._db.execute(f"SELECT 1 FROM candidates {where} AND status != ? LIMIT 1",
                                   (*args, Status.ERROR.value)).fetchone()
        if decided is not None:
            return True
        errors = self._db.execute(f"SELECT COUNT(*) FROM candidates {where} AND status = ?",
                                  (*args, Status.ERROR.value)).fetchone()[0]
        return errors >= ERROR_RETRIES

    def history(self, candidate_hash: str) -> list[CandidateRecord]:
        """Every evaluation of one proposal, oldest first."""
        return self._candidates("WHERE candidate_hash = ?", (candidate_hash,))

    def lesson(self, record_hash: str) -> Lesson:
        rows = self._db.execute("SELECT id, content FROM lessons WHERE record_hash LIKE ? || '%' LIMIT 2",
                                (record_hash,)).fetchall()
        if len(rows) != 1:
            raise UnknownRecord(f"{'no' if not rows else 'more than one'} lesson matches {record_hash!r}")
        return Lesson.from_content(json.loads(rows[0][1]), rows[0][0])

    def lessons(self, class_key: str | None = None, *, outcome: Outcome | None = None) -> list[Lesson]:
        """Lessons for a region class (all of them without ``class_key``), oldest first."""
        clauses, args = [], []
        if class_key:
            clauses.append("class_key = ?")
            args.append(class_key)
        if outcome:
            clauses.append("outcome = ?")
            args.append(Outcome(outcome).value)
        where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
        rows = self._db.execute(f"SELECT id, content FROM lessons {where} ORDER BY created_at, id", args).fetchall()
        return [Lesson.from_content(json.loads(content), row_id) for row_id, content in rows]

    def counts(self) -> dict[str, int]:
        return {table: self._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                for table in ("environments", "regions", "candidates", "lessons")}

    def exists(self, record_hash: str) -> bool:
        """Whether a candidate record with this exact hash is stored (pruned links say no)."""
        return self._db.execute("SELECT 1 FROM candidates WHERE record_hash = ?", (record_hash,)).fetchone() is not None
