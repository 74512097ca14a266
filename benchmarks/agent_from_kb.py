"""A run's evaluations read back from its knowledge base, for a run killed before it wrote its results.

    python -m benchmarks.agent_from_kb RUN_KB --seed-kb SEED_KB --workload qwen-image --out agent_qwen-image-x.json

Every evaluation is recorded in the KB the moment it ends, so the KB a killed run leaves holds what
it measured. The records in RUN_KB that are not in SEED_KB (the KB the run started from: ``--kb`` is a
copy of it) are that run's, oldest first; each becomes one evaluation in ``benchmarks.agent_run``'s
format, marked ``"finished": false`` and ``"from_kb": true``, which ``benchmarks.agent_curves`` reads.
Not in a KB record: the seconds an evaluation took (its record's time minus the previous record's is
given as ``seconds``, none for the first) and the run's clock and profile.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    import sys

    sys.path.append(str(Path(__file__).resolve().parents[1]))


def run_records(run_kb: Path, seed_kb: Path | None) -> list[Any]:
    """The records ``run_kb`` holds beyond ``seed_kb``, oldest first."""
    from kopt.agent.kb import KnowledgeBase

    seen = set()
    if seed_kb is not None:
        with KnowledgeBase(seed_kb) as kb:
            seen = {r.record_hash for r in kb.candidates()}
    with KnowledgeBase(run_kb) as kb:
        return [r for r in kb.candidates() if r.record_hash not in seen]


def as_run(records: list[Any], workload: str, source: str) -> dict[str, Any]:
    """``records`` as a ``benchmarks.agent_run`` result (unfinished, read from a KB)."""
    evaluations, previous = [], None
    for record in records:
        candidate = record.candidate
        e2e = {"speedup": record.e2e.to_dict()} if record.e2e else None
        evaluations.append({"candidate": record.candidate_hash, "region": record.region_signature,
                            "kind": candidate["kind"], "params": dict(candidate.get("params", [])),
                            "status": record.status.value, "reason": record.reason,
                            "seconds": None if previous is None else record.created_at - previous, "e2e": e2e})
        previous = record.created_at
    return {"workload": workload, "finished": False, "from_kb": source, "evaluations": evaluations}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_kb", type=Path)
    parser.add_argument("--seed-kb", type=Path, default=None, help="the KB the run started from (none: empty)")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    data = as_run(run_records(args.run_kb, args.seed_kb), args.workload, str(args.run_kb))
    args.out.write_text(json.dumps(data, indent=1))
    print(f"{len(data['evaluations'])} evaluations -> {args.out}")


if __name__ == "__main__":
    main()
