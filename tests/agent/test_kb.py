"""The knowledge base: a real SQLite file, immutable records, queries for the loop, migrations,
two writing processes at once, export/import without duplicates, and prune."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kopt.agent.kb import (
    CorruptExport,
    KnowledgeBase,
    Measurement,
    Outcome,
    Status,
    UnknownRecord,
    default_path,
    export,
    import_lines,
    prune,
)
from kopt.agent.kb import schema as kb_schema
from tests.agent.kb_helpers import GPU_ENV, candidate_for, scaled_gelu_region

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def kb(tmp_path):
    with KnowledgeBase(tmp_path / "kb.sqlite") as base:
        yield base


def test_default_file_follows_kopt_cache_dir(monkeypatch, tmp_path):
    """Without a path the file is $KOPT_CACHE_DIR/kb.sqlite (kopt's cache folder), else ~/.cache/kopt."""
    monkeypatch.setenv("KOPT_CACHE_DIR", str(tmp_path / "cache"))
    assert default_path() == tmp_path / "cache" / "kb.sqlite"
    with KnowledgeBase() as base:
        assert base.path == tmp_path / "cache" / "kb.sqlite" and base.path.exists()
    monkeypatch.delenv("KOPT_CACHE_DIR")
    assert default_path() == Path.home() / ".cache" / "kopt" / "kb.sqlite"


def test_file_is_wal_and_at_the_latest_schema(kb):
    """WAL journal (concurrent readers and one writer), foreign keys on, schema version stamped."""
    raw = sqlite3.connect(kb.path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert raw.execute("PRAGMA user_version").fetchone()[0] == len(kb_schema.MIGRATIONS) == kb.schema_version
    raw.close()


def test_record_and_query_for_the_loop(kb):
    """Accepted candidates per signature and environment, latest evaluations for resuming, lessons per class."""
    region = scaled_gelu_region()
    kb.record_region(region, model="flux1")
    kb.record_region(region, model="wan")  # the first model seen is kept
    assert kb.region(region.signature).first_model == "flux1"
    assert kb.region(region.signature[:10]).fx_text == region.text.exact
    first, second = candidate_for(region, 1), candidate_for(region, 2)
    speedup = Measurement("speedup", 1.031, 1.012, 1.049, 24)
    won = kb.record_candidate(first, status=Status.ACCEPTED, reason="E2E win", e2e=speedup, environment=GPU_ENV)
    lost = kb.record_candidate(second, status=Status.SLOWER, reason="0.2% slower", environment=GPU_ENV)
    assert [r.record_hash for r in kb.accepted(region.signature, GPU_ENV)] == [won.record_hash]
    assert kb.accepted(region.signature, kb.record_environment()) == []  # another environment knows nothing yet
    latest = {r.candidate_hash for r in kb.latest(signature=region.signature)}
    assert latest == {first.content_hash, second.content_hash}
    assert kb.has_evaluated(first, GPU_ENV) and not kb.has_evaluated(candidate_for(region, 3))
    assert kb.candidate(won.id).e2e == speedup and kb.candidate(won.record_hash[:10]).status is Status.ACCEPTED
    lesson = kb.record_lesson(region.class_key, Outcome.WORKED, "fusing the bias into gelu pays at width 32",
                              evidence=[won, lost], region_signature=region.signature)
    assert kb.lessons(region.class_key) == [lesson] and lesson.evidence == (won.record_hash, lost.record_hash)
    assert kb.lessons("another class") == []


def test_a_candidate_measured_in_place_of_another_ranks_by_its_speedup_over_the_base(kb):
    """The loop times a region's second candidate against the first (``e2e.against``): 1.02x over a
    1.05x win is 1.071x over the base and goes first; a raw 1.03x over the base goes after both."""
    region = scaled_gelu_region()
    kb.record_region(region)
    first, second, third = (candidate_for(region, v) for v in (1, 2, 3))
    early = kb.record_candidate(first, status=Status.ACCEPTED, reason="win",
                                e2e=Measurement("speedup", 1.05, 1.03, 1.07, 20), environment=GPU_ENV)
    on_top = kb.record_candidate(second, status=Status.ACCEPTED, reason="win over the first",
                                 e2e=Measurement("speedup", 1.02, 1.01, 1.03, 20, against=first.content_hash),
                                 environment=GPU_ENV)
    alone = kb.record_candidate(third, status=Status.ACCEPTED, reason="win",
                                e2e=Measurement("speedup", 1.03, 1.01, 1.05, 20), environment=GPU_ENV)
    assert [r.record_hash for r in kb.accepted(region.signature, GPU_ENV)] == [
        on_top.record_hash, early.record_hash, alone.record_hash]
    assert kb.candidate(on_top.id).e2e.against == first.content_hash
    assert "against" not in Measurement("speedup", 1.0, 1.0, 1.0, 1).to_dict()  # older records keep their hashes
    kb.record_candidate(first, status=Status.SLOWER, reason="slower on a re-run", environment=GPU_ENV,
                        supersedes=early)
    assert [r.record_hash for r in kb.accepted(region.signature, GPU_ENV)] == [alone.record_hash, on_top.record_hash]


def test_records_are_immutable_and_a_re_evaluation_supersedes(kb):
    """UPDATE is refused by the database; a re-evaluation is a new record linked to the old one,
    and the newest evaluation is the one that counts."""
    region = scaled_gelu_region()
    kb.record_region(region)
    candidate = candidate_for(region)
    old = kb.record_candidate(candidate, status=Status.ACCEPTED, reason="won", environment=GPU_ENV, created_at=1.0)
    with pytest.raises(sqlite3.IntegrityError, match="immutable"):
        kb._db.execute("UPDATE candidates SET status = 'rejected' WHERE id = ?", (old.id,))
    new = kb.record_candidate(candidate, status=Status.SLOWER, reason="re-measured: no gain", environment=GPU_ENV,
                              supersedes=old, created_at=2.0)
    assert new.supersedes == old.record_hash and new.record_hash != old.record_hash
    assert [r.status for r in kb.history(candidate.content_hash)] == [Status.ACCEPTED, Status.SLOWER]
    assert kb.accepted(region.signature, GPU_ENV) == []  # the newer evaluation replaced the win
    again = kb.record_candidate(candidate, status=Status.SLOWER, reason="re-measured: no gain", environment=GPU_ENV,
                                supersedes=old, created_at=2.0)
    assert again.id == new.id  # the identical record is stored once


def test_a_candidate_needs_its_region(kb):
    """Recording an evaluation of a region the base does not know is refused with the fix in the message."""
    region = scaled_gelu_region()
    with pytest.raises(UnknownRecord, match="record_region"):
        kb.record_candidate(candidate_for(region), status=Status.REJECTED, reason="x", environment=GPU_ENV)
    assert kb.counts()["candidates"] == 0


def test_stores_a_real_verdict(kb):
    """A verifier verdict goes in as a whole (checks, log) and comes back as data."""
    from kopt.agent.verify import CheckResult
    from kopt.agent.verify.verdict import decide

    region = scaled_gelu_region()
    kb.record_region(region)
    verdict = decide([CheckResult("values", False, "relative error 1 > bound 1e-05", 0, (("rel_err", 1.0),))], 13,
                     2.5, "trial 0: own shapes; normal/normal")
    record = kb.record_candidate(candidate_for(region), status=Status.REJECTED, reason=verdict.reason, verdict=verdict,
                                 environment=GPU_ENV)
    stored = kb.candidate(record.id).verification
    assert stored["accepted"] is False and stored["checks"][0]["numbers"] == {"rel_err": 1.0}


def test_migration_path_upgrades_old_files_and_refuses_newer_ones(tmp_path, monkeypatch):
    """A file at version 1 is upgraded by a later migration with its data kept; a file from a newer
    kopt is refused instead of misread."""
    path = tmp_path / "kb.sqlite"
    region = scaled_gelu_region()
    with KnowledgeBase(path) as kb:
        kb.record_region(region)
        kb.record_candidate(candidate_for(region), status=Status.REJECTED, reason="x", environment=GPU_ENV)
    step = "CREATE TABLE llm_exchanges (id INTEGER PRIMARY KEY, content TEXT NOT NULL);"
    monkeypatch.setattr(kb_schema, "MIGRATIONS", [*kb_schema.MIGRATIONS, step])
    with KnowledgeBase(path) as kb:
        assert kb.schema_version == 2 and kb.counts()["candidates"] == 1
        kb._db.execute("INSERT INTO llm_exchanges (content) VALUES ('{}')")
    monkeypatch.setattr(kb_schema, "MIGRATIONS", kb_schema.MIGRATIONS[:1])
    with pytest.raises(kb_schema.SchemaTooNew, match="newer than this kopt"):
        KnowledgeBase(path)


def test_two_processes_write_at_once(tmp_path):
    """Two real processes, each recording 60 evaluations and 6 lessons into one new file at the same
    time (both create and migrate it, then start writing together): every record lands exactly once,
    nothing fails, and the writes did interleave."""
    path = tmp_path / "shared.sqlite"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    workers = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "agent" / "kb_writer.py"), str(path), str(w),
                                 "60", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
               for w in (1, 2)]
    outputs = [w.communicate(timeout=240) for w in workers]
    for worker, (_, errors) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, errors[-2000:]
    first, second = ([tuple(map(float, line.split())) for line in out.splitlines()] for out, _ in outputs)
    assert len(first) == len(second) == 60
    order = [who for _, who in sorted([(start, 1) for start, _ in first] + [(start, 2) for start, _ in second])]
    switches = sum(1 for a, b in zip(order, order[1:], strict=False) if a != b)
    assert switches >= 10, f"the two writers barely interleaved ({switches} switches)"
    with KnowledgeBase(path) as kb:
        assert kb.counts() == {"environments": 1, "regions": 1, "candidates": 120, "lessons": 12}
        assert len({r.candidate_hash for r in kb.candidates()}) == 120


def test_two_processes_open_a_new_file_at_once():
    """Switching a new file to WAL is not covered by SQLite's busy timeout: two processes opening a new
    KB at the same moment used to fail one time in two with "database is locked"."""
    import tempfile
    import time

    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        start = str(time.time() + 15)  # both have imported kopt by then
        workers = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "agent" / "kb_opener.py"), folder, start,
                                     "12"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                   for _ in range(2)]
        outputs = [w.communicate(timeout=180) for w in workers]
    for worker, (out, errors) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, errors[-2000:]
        assert len(out.splitlines()) == 12


def _filled(kb: KnowledgeBase) -> None:
    region = scaled_gelu_region()
    kb.record_region(region, model="flux1")
    old = kb.record_candidate(candidate_for(region, 1), status=Status.ACCEPTED, reason="won", environment=GPU_ENV,
                              e2e=Measurement("speedup", 1.02, 1.01, 1.03, 20), created_at=1000.0,
                              seconds=42.0)
    kb.record_candidate(candidate_for(region, 1), status=Status.SLOWER, reason="lost", environment=GPU_ENV,
                        supersedes=old, created_at=2000.0)
    rejected = kb.record_candidate(candidate_for(region, 2), status=Status.REJECTED, reason="values",
                                   environment=GPU_ENV, created_at=1500.0)
    kb.record_lesson(region.class_key, Outcome.FAILED, "variant 2 is wrong", evidence=[rejected], created_at=1600.0)


def test_export_import_round_trip_without_duplicates(tmp_path):
    """An export imported into an empty file reproduces every record (same hashes); importing it again,
    or into the file it came from, adds nothing."""
    with KnowledgeBase(tmp_path / "a.sqlite") as source:
        _filled(source)
        stream = io.StringIO()
        export(source, stream)
        text = stream.getvalue()
        assert import_lines(source, text.splitlines()).added == {}
        hashes = {r.record_hash for r in source.candidates()}
    with KnowledgeBase(tmp_path / "b.sqlite") as target:
        counts = import_lines(target, text.splitlines())
        assert counts.added == {"environment": 1, "region": 1, "candidate": 3, "lesson": 1}
        assert {r.record_hash for r in target.candidates()} == hashes
        assert import_lines(target, text.splitlines()).added == {}
        assert target.counts()["candidates"] == 3


def test_import_refuses_an_edited_record_and_imports_nothing(tmp_path):
    """A record whose content no longer matches its hash stops the import; the transaction leaves the
    file untouched."""
    with KnowledgeBase(tmp_path / "a.sqlite") as source:
        _filled(source)
        lines = list(export_lines_of(source))
    tampered = [json.loads(line) for line in lines]
    for data in tampered:
        if data["type"] == "candidate" and data["content"]["status"] == "rejected":
            data["content"]["status"] = "accepted"
    with KnowledgeBase(tmp_path / "b.sqlite") as target:
        with pytest.raises(CorruptExport, match="does not match its content"):
            import_lines(target, [json.dumps(d) for d in tampered])
        assert target.counts() == {"environments": 0, "regions": 0, "candidates": 0, "lessons": 0}


def export_lines_of(kb):
    from kopt.agent.kb.transfer import export_lines

    return export_lines(kb)


def test_prune_by_age_and_status_with_a_dry_run(kb):
    """A dry run deletes nothing; prune removes proposals whose newest evaluation is old and rejected or
    slower (with their history: an old win superseded by a loss must not come back), keeps accepted
    ones unless named, keeps lessons (their evidence then reads as pruned)."""
    _filled(kb)
    region = kb.regions()[0]
    kept = kb.record_candidate(candidate_for_signature(region.signature, 7), status=Status.ACCEPTED, reason="won",
                               environment=GPU_ENV, created_at=1200.0)
    plan = prune(kb, older_than_days=1, dry_run=True, now=1800.0 + 86400)
    assert [r.status for r in plan.candidates] == [Status.REJECTED] and kb.counts()["candidates"] == 4
    prune(kb, older_than_days=1, now=1800.0 + 86400)  # variant 1's newest (slower, t=2000) is not old enough yet
    assert sorted(r.status.value for r in kb.candidates()) == ["accepted", "accepted", "slower"]
    prune(kb, older_than_days=1, now=2500.0 + 86400)  # now it is: its accepted predecessor goes with it
    assert [r.record_hash for r in kb.candidates()] == [kept.record_hash]
    assert kb.accepted(region.signature, GPU_ENV) == [kept]
    prune(kb, older_than_days=1, statuses=[Status.ACCEPTED], now=2500.0 + 86400)
    assert kb.counts() == {"environments": 0, "regions": 1, "candidates": 0, "lessons": 1}  # the region is recent
    assert not kb.exists(kb.lessons()[0].evidence[0])


def candidate_for_signature(signature, variant):
    from kopt.agent.candidate import Candidate, CandidateKind
    from kopt.passes.base import Contract

    return Candidate(signature, CandidateKind.CODEGEN_VARIANT, f"def candidate(b, x):\n    return x  # {variant}\n",
                     Contract.tolerance(1e-5))


def test_kb_command_line(tmp_path, capsys):
    """kopt kb list / show / export / import / prune --dry-run through the real CLI parser."""
    from kopt.cli import main

    path = tmp_path / "kb.sqlite"
    with KnowledgeBase(path) as kb:
        _filled(kb)
        first = kb.candidates()[0]
    assert main(["kb", "--kb", str(path), "list"]) == 0
    listing = capsys.readouterr().out
    assert "3 candidate records" in listing and first.record_hash[:12] in listing and "accepted" in listing
    assert main(["kb", "--kb", str(path), "list", "--status", "rejected", "--json"]) == 0
    assert [r["status"] for r in json.loads(capsys.readouterr().out)] == ["rejected"]
    assert main(["kb", "--kb", str(path), "show", first.record_hash[:10]]) == 0
    shown = capsys.readouterr().out
    assert "superseded by" in shown and "def candidate(b, x)" in shown and "the evaluation took 42.0 s" in shown
    export_file = tmp_path / "kb.jsonl"
    assert main(["kb", "--kb", str(path), "export", str(export_file)]) == 0
    assert main(["kb", "--kb", str(tmp_path / "copy.sqlite"), "import", str(export_file)]) == 0
    assert "candidate: 3 added" in capsys.readouterr().out
    assert main(["kb", "--kb", str(tmp_path / "copy.sqlite"), "import", str(export_file)]) == 0
    assert "candidate: 0 added, 3 already present" in capsys.readouterr().out
    assert main(["kb", "--kb", str(path), "prune", "--older-than", "1", "--dry-run"]) == 0
    assert "would delete 3 candidate records" in capsys.readouterr().out
    with KnowledgeBase(path) as kb:
        assert kb.counts()["candidates"] == 3


def test_kb_console_script(tmp_path):
    """The installed ``kopt`` entry point has the kb command."""
    KnowledgeBase(tmp_path / "kb.sqlite").close()
    done = subprocess.run(["kopt", "kb", "--kb", str(tmp_path / "kb.sqlite"), "list"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "0 candidate records" in done.stdout


@pytest.mark.parametrize("command", [["list"], ["show", "abc"], ["export"], ["prune", "--older-than", "1"]])
def test_kb_commands_refuse_a_missing_file(tmp_path, command):
    """Reading commands name the missing file and leave none behind: an empty default knowledge base
    would be read by every later ``kopt.compile(passes="auto")``."""
    from kopt.cli import main

    missing = tmp_path / "none.sqlite"
    with pytest.raises(SystemExit, match="no knowledge base at .*none.sqlite"):
        main(["kb", "--kb", str(missing), *command])
    assert not missing.exists()
