"""``kopt kb list|show|export|import|prune``: look into and maintain the knowledge base from a shell."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from kopt.agent.kb.records import CandidateRecord, Status
from kopt.agent.kb.store import KnowledgeBase, UnknownRecord, default_path
from kopt.agent.kb.transfer import CorruptExport, export, import_lines, prune


def _open(args: argparse.Namespace, *, create: bool = False) -> KnowledgeBase:
    """The knowledge base named by ``--kb`` (or the default). Only ``import`` may create one: opening a
    missing file would leave an empty knowledge base behind, and an existing default one is read by
    every ``kopt.compile(passes="auto")`` of this user."""
    path = Path(args.kb) if args.kb is not None else default_path()
    if not create and not path.exists():
        raise SystemExit(f"kopt kb {args.kb_command}: no knowledge base at {path} ('kopt optimize' or "
                         "'kopt kb import' creates one; --kb names another file)")
    return KnowledgeBase(path)


def _age(created_at: float) -> str:
    seconds = max(0.0, time.time() - created_at)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _row(record: CandidateRecord) -> str:
    e2e = f"{record.e2e.median:.3f}x" if record.e2e else "-"
    return (f"{record.id:>5}  {record.record_hash[:12]}  {record.region_signature[:12]}  {record.kind:<16} "
            f"{record.status.value:<9} {e2e:>8}  {_age(record.created_at):>5}  {record.reason[:70]}")


def _cmd_list(args: argparse.Namespace) -> int:
    with _open(args) as kb:
        records = kb.candidates(signature=args.signature, class_key=args.class_key,
                                status=Status(args.status) if args.status else None, limit=args.limit)
        if args.json:
            print(json.dumps([{"id": r.id, "record_hash": r.record_hash, **r.content()} for r in records], indent=1))
            return 0
        counts = kb.counts()
        print(f"{kb.path}: {counts['candidates']} candidate records, {counts['regions']} regions, "
              f"{counts['lessons']} lessons, {counts['environments']} environments")
        if records:
            print(f"{'id':>5}  {'record':<12}  {'region':<12}  {'kind':<16} {'status':<9} {'e2e':>8}  {'age':>5}  "
                  "reason")
            print("\n".join(_row(r) for r in records))
    return 0


def _show_candidate(kb: KnowledgeBase, record: CandidateRecord) -> None:
    candidate = record.candidate
    print(f"candidate record {record.id}  {record.record_hash}")
    print(f"  proposal   {record.candidate_hash}  ({candidate['kind']}, {candidate['convention']}, by "
          f"{candidate.get('origin') or '?'})")
    print(f"  region     {record.region_signature}")
    print(f"  status     {record.status.value}: {record.reason}")
    print(f"  contract   {candidate['contract']}")
    took = f" (the evaluation took {record.seconds:.1f} s)" if record.seconds is not None else ""
    print(f"  recorded   {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(record.created_at))}{took}")
    if record.supersedes:
        print(f"  supersedes {record.supersedes[:12]}{'' if kb.exists(record.supersedes) else ' (pruned)'}")
    later = [r for r in kb.history(record.candidate_hash) if r.supersedes == record.record_hash]
    for newer in later:
        print(f"  superseded by {newer.record_hash[:12]} ({newer.status.value})")
    for name, measured in (("micro", record.micro), ("e2e", record.e2e)):
        if measured:
            print(f"  {name:<10} {measured.median:.4g} {measured.unit} [95% CI {measured.ci_low:.4g}, "
                  f"{measured.ci_high:.4g}], {measured.samples} samples")
    if candidate.get("why"):
        print(f"  why        {candidate['why']}")
    if record.verification:
        print("\n".join(_verification_lines(record.verification)))
    print("  source:\n" + "\n".join("    " + line for line in candidate["source"].splitlines()))


def _verification_lines(verification: dict) -> list[str]:
    """A region verdict (sandbox checks over trials) or a pipeline choice's (model-output checks, or
    why it was settled without them)."""
    if "trials" in verification:
        failed = [c for c in verification.get("checks", []) if not c["passed"]]
        return ([f"  verified   {verification['reason']} ({verification['trials']} trials)"]
                + [f"    - {c['name']}: {c['detail']}" for c in failed[:5]])
    checks = verification.get("checks", [])
    lines = [f"  verified   {verification.get('kind', '?')}: "
             + (verification.get("reason") or f"{sum(c['ok'] for c in checks)}/{len(checks)} model outputs "
                "within the contract")]
    for check in checks[:5]:
        lines.append(f"    - graph {check['graph']} output {check['output']}: rel err {check['rel_err']:.3g}, "
                     f"cosine {check['cosine']:.6f}{'' if check['ok'] else ' (outside the contract)'}")
    return lines


def _cmd_show(args: argparse.Namespace) -> int:
    with _open(args) as kb:
        try:
            _show_candidate(kb, kb.candidate(args.key))
            return 0
        except UnknownRecord:
            pass
        try:
            region = kb.region(args.key)
        except UnknownRecord as error:
            raise SystemExit(f"kopt kb: {error} (and no region matches it either)") from None
        print(f"region {region.signature}\n  class {region.class_key}\n  first seen in {region.first_model or '?'}")
        print("\n".join("  " + line for line in region.fx_text.splitlines()))
        for record in kb.latest(signature=region.signature):
            print(_row(record))
        for lesson in kb.lessons(region.class_key):
            print(f"  lesson ({lesson.outcome.value}): {lesson.text}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    with _open(args) as kb:
        if args.file in (None, "-"):
            count = export(kb, sys.stdout)
        else:
            with open(args.file, "w") as stream:
                count = export(kb, stream)
            print(f"exported {count} records to {args.file}", file=sys.stderr)
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    with _open(args, create=True) as kb:
        try:
            stream = sys.stdin if args.file == "-" else open(args.file)  # noqa: SIM115 - closed below
            try:
                counts = import_lines(kb, stream)
            finally:
                if stream is not sys.stdin:
                    stream.close()
        except (CorruptExport, OSError) as error:
            raise SystemExit(f"kopt kb import: {error}; nothing was imported") from None
        print(f"imported {args.file}: {counts}")
    return 0


def _cmd_prune(args: argparse.Namespace) -> int:
    statuses = [Status(s) for s in args.status] if args.status else None
    with _open(args) as kb:
        plan = prune(kb, older_than_days=args.older_than, dry_run=args.dry_run,
                     **({"statuses": statuses} if statuses else {}))
        verb = "would delete" if args.dry_run else "deleted"
        print(f"{verb} {plan} (older than {args.older_than:g} days)")
        for record in plan.candidates[: args.show]:
            print(_row(record))
    return 0


def add_kb_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``kopt kb`` on the ``kopt`` command line (called from :mod:`kopt.cli`)."""
    kb = commands.add_parser("kb", help="list, show, export, import or prune the agent's knowledge base")
    kb.add_argument("--kb", type=Path, default=None, help=f"the knowledge base file (default {default_path()})")
    sub = kb.add_subparsers(dest="kb_command", required=True)
    listing = sub.add_parser("list", help="candidate records, oldest first")
    listing.add_argument("--status", choices=[s.value for s in Status])
    listing.add_argument("--signature", help="region signature (prefix)")
    listing.add_argument("--class", dest="class_key", help="region class key (prefix)")
    listing.add_argument("--limit", type=int, default=None, help="only the newest N")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(run=_cmd_list)
    show = sub.add_parser("show", help="one candidate record (id or hash prefix) or one region (signature prefix)")
    show.add_argument("key")
    show.set_defaults(run=_cmd_show)
    exporting = sub.add_parser("export", help="write every record as JSON lines")
    exporting.add_argument("file", nargs="?", default="-", help="output file (default: stdout)")
    exporting.set_defaults(run=_cmd_export)
    importing = sub.add_parser("import", help="add the records of an export (records already present are skipped)")
    importing.add_argument("file", help="a file written by 'kopt kb export' ('-' for stdin)")
    importing.set_defaults(run=_cmd_import)
    pruning = sub.add_parser("prune", help="delete old candidate records by status (accepted ones only if named)")
    pruning.add_argument("--older-than", type=float, required=True, metavar="DAYS")
    pruning.add_argument("--status", action="append", choices=[s.value for s in Status],
                         help="statuses to delete (repeatable; default: rejected, error, slower)")
    pruning.add_argument("--dry-run", action="store_true", help="only report what would be deleted")
    pruning.add_argument("--show", type=int, default=20, help="list at most N of the records concerned")
    pruning.set_defaults(run=_cmd_prune)
