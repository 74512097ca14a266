"""The knowledge base's tables, and the migrations that build them, one schema version per step.

``PRAGMA user_version`` holds the version. Opening a database applies every later migration in
one write transaction (``BEGIN IMMEDIATE``), so two processes opening an old file at once migrate
it exactly once: the second waits, then finds the new version. A file from a newer kopt is
refused rather than misread. A new version appends a step to :data:`MIGRATIONS`; steps are never
edited once released, so any old file upgrades through the same path.

Candidate and lesson records are immutable (triggers refuse UPDATE): a re-evaluation is a new
record linked to the old one by ``supersedes``. ``supersedes`` and lesson evidence are record
hashes without foreign keys, because pruning may delete what they point to; the link then says
"(pruned)" instead of breaking the row.
"""

from __future__ import annotations

import sqlite3

V1 = """
CREATE TABLE environments (
    key TEXT PRIMARY KEY,
    gpu TEXT NOT NULL, driver TEXT NOT NULL, cuda TEXT NOT NULL, torch TEXT NOT NULL, triton TEXT NOT NULL,
    kopt TEXT NOT NULL, python TEXT NOT NULL, platform TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE regions (
    signature TEXT PRIMARY KEY,
    class_key TEXT NOT NULL,
    fx_text TEXT NOT NULL,
    class_text TEXT NOT NULL,
    source TEXT NOT NULL,
    inputs TEXT NOT NULL,
    outputs TEXT NOT NULL,
    first_model TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX regions_by_class ON regions (class_key);
CREATE TABLE candidates (
    id INTEGER PRIMARY KEY,
    record_hash TEXT NOT NULL UNIQUE,
    candidate_hash TEXT NOT NULL,
    region_signature TEXT NOT NULL REFERENCES regions (signature),
    environment_key TEXT NOT NULL REFERENCES environments (key),
    kind TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('rejected', 'verified', 'slower', 'accepted', 'error')),
    reason TEXT NOT NULL,
    content TEXT NOT NULL,
    supersedes TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX candidates_by_region ON candidates (region_signature, environment_key, status);
CREATE INDEX candidates_by_proposal ON candidates (candidate_hash, environment_key, created_at);
CREATE INDEX candidates_by_age ON candidates (created_at);
CREATE TRIGGER candidates_are_immutable BEFORE UPDATE ON candidates
BEGIN SELECT RAISE(ABORT, 'candidate records are immutable: record a re-evaluation instead'); END;
CREATE TABLE lessons (
    id INTEGER PRIMARY KEY,
    record_hash TEXT NOT NULL UNIQUE,
    class_key TEXT NOT NULL,
    region_signature TEXT,
    outcome TEXT NOT NULL CHECK (outcome IN ('worked', 'failed')),
    content TEXT NOT NULL,
    environment_key TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX lessons_by_class ON lessons (class_key, created_at);
CREATE TRIGGER lessons_are_immutable BEFORE UPDATE ON lessons
BEGIN SELECT RAISE(ABORT, 'lessons are immutable: record a new lesson instead'); END;
"""

MIGRATIONS: list[str] = [V1]  # MIGRATIONS[k] takes a database from version k to k + 1


class SchemaTooNew(RuntimeError):
    """The file was written by a newer kopt whose schema this one does not know."""


def version(connection: sqlite3.Connection) -> int:
    return int(connection.execute("PRAGMA user_version").fetchone()[0])


def migrate(connection: sqlite3.Connection, migrations: list[str] | None = None) -> int:
    """Bring the database to the latest version inside one immediate transaction; returns it.
    The connection must be in autocommit mode (``isolation_level=None``)."""
    steps = MIGRATIONS if migrations is None else migrations
    connection.execute("BEGIN IMMEDIATE")
    try:
        current = version(connection)
        if current > len(steps):
            raise SchemaTooNew(f"knowledge base schema version {current} is newer than this kopt's "
                               f"({len(steps)}); upgrade kopt or use another --kb file")
        for step in steps[current:]:
            for statement in _statements(step):
                connection.execute(statement)
        connection.execute(f"PRAGMA user_version = {len(steps)}")
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    return len(steps)


def _statements(script: str) -> list[str]:
    """Split a migration into statements (``executescript`` would commit the open transaction)."""
    statements, current = [], []
    for line in script.strip().splitlines():
        current.append(line)
        if sqlite3.complete_statement("\n".join(current)):  # knows that a trigger ends at END;
            statements.append("\n".join(current))
            current = []
    if "\n".join(current).strip():
        raise ValueError(f"incomplete SQL statement in a migration: {' '.join(current)[:80]}")
    return statements
