"""The frozen corpus: no adversarial candidate is accepted, no honest one is rejected.

Every file under ``corpus/adversarial/<family>/`` exploits one known way to fool a verifier and
names the checks allowed to catch it; every file under ``corpus/honest/`` is a correct but tricky
replacement that must pass. Verifications run two at a time (the CI machine has two cores); the
summary (counts, wall time, per-family results) is printed (``pytest -s`` shows it).
"""

from __future__ import annotations

import collections
import concurrent.futures
import time

import pytest

from kopt.agent.verify import VerifyConfig, verify
from tests.agent.corpus.load import corpus
from tests.agent.corpus.regions import REGIONS

# A shorter call limit than the default keeps the sleeping and spinning candidates cheap; the
# slowest honest call (a Triton kernel in the interpreter) takes well under a second.
CONFIG = VerifyConfig(call_timeout_s=5.0, timeout_s=90.0)
WORKERS = 2


@pytest.fixture(scope="module")
def entries():
    return corpus(CONFIG)


def test_corpus_is_frozen_at_its_size(entries):
    """>= 80 adversarial candidates over >= 15 exploit families (>= 3 each), >= 20 honest ones."""
    found, _ = entries
    families = collections.Counter(e.family for e in found if not e.honest)
    assert sum(families.values()) >= 80 and len(families) >= 15, families
    assert min(families.values()) >= 3, families
    assert sum(1 for e in found if e.honest) >= 20
    assert sum(1 for e in found if e.honest and e.candidate.kind.value == "triton-kernel") >= 2


def test_corpus_regions_keep_their_canonical_input_order(entries):
    """Candidates take the region's inputs in canonical order; this pins that order for each region."""
    _, regions = entries
    for name, region in regions.items():
        assert tuple(n.name.removesuffix("_1") for n in region.input_nodes) == REGIONS[name].canonical, name


def test_no_false_accept_and_no_false_reject(entries):
    """Every adversarial candidate is rejected by one of the checks its file names; every honest one is
    accepted."""
    found, regions = entries
    started = time.monotonic()

    def run(entry):
        return entry, verify(regions[entry.region], entry.candidate, entry.config)

    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(run, found))
    elapsed = time.monotonic() - started
    wrong, by_family = [], collections.defaultdict(collections.Counter)
    for entry, verdict in results:
        if entry.honest:
            ok = verdict.accepted
        else:
            ok = not verdict.accepted and bool(verdict.failed_names & entry.expect)
        by_family[entry.family]["ok" if ok else "wrong"] += 1
        if not ok:
            wrong.append(f"{entry.family}/{entry.path.name}: expected {sorted(entry.expect)}, got {verdict}")
    adversarial = sum(1 for e, _ in results if not e.honest)
    false_accepts = sum(1 for e, v in results if not e.honest and v.accepted)
    false_rejects = sum(1 for e, v in results if e.honest and not v.accepted)
    print(f"\nverifier corpus: {adversarial} adversarial, {len(results) - adversarial} honest, "
          f"{false_accepts} false accepts, {false_rejects} false rejects, {elapsed:.0f} s wall with {WORKERS} workers")
    for family, counts in sorted(by_family.items()):
        print(f"  {family:<20} {counts['ok']:>3} ok {counts['wrong']:>3} wrong")
    assert not wrong, "\n".join(wrong)
