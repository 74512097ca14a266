"""The agent's knowledge base: environments, regions, candidate evaluations and lessons, in SQLite.

    from kopt.agent.kb import KnowledgeBase, Status
    with KnowledgeBase() as kb:                       # $KOPT_CACHE_DIR/kb.sqlite or ~/.cache/kopt/kb.sqlite
        kb.record_region(region, model="flux1")
        kb.record_candidate(candidate, status=Status.REJECTED, reason=verdict.reason, verdict=verdict)
        kb.accepted(region.signature, environment)     # what passes="auto" may apply here
        kb.latest(signature=...)                       # what a resumed run has already evaluated
        kb.lessons(region.class_key)                   # what the next proposals read

Files: :mod:`.records` (typed records, content hashes), :mod:`.schema` (tables, migrations),
:mod:`.store` (the API), :mod:`.transfer` (export, import, prune), :mod:`.environment`,
:mod:`.cli` (``kopt kb``).
"""

from kopt.agent.kb.environment import current_environment
from kopt.agent.kb.records import CandidateRecord, Environment, Lesson, Measurement, Outcome, RegionRecord, Status
from kopt.agent.kb.store import KnowledgeBase, UnknownRecord, default_path
from kopt.agent.kb.transfer import CorruptExport, ImportCounts, PrunePlan, export, import_lines, prune

__all__ = ["CandidateRecord", "CorruptExport", "Environment", "ImportCounts", "KnowledgeBase", "Lesson", "Measurement",
           "Outcome", "PrunePlan", "RegionRecord", "Status", "UnknownRecord", "current_environment", "default_path",
           "export", "import_lines", "prune"]
