"""A trial the machine could not run (no device memory) is an error to retry: neither a rejection, which
the knowledge base would keep forever, nor an acceptance."""

from __future__ import annotations

import torch

from kopt.agent import region as regions
from kopt.agent.candidate import Candidate, CandidateKind
from kopt.agent.kb import KnowledgeBase, Status
from kopt.agent.verify import VerifyConfig, verify
from kopt.passes.base import Contract

TOL = Contract.tolerance(1e-5)
QUICK = VerifyConfig(shape_trials=1)


def _region():
    return regions.from_function(lambda x: x * 3.0 + 1.0, torch.randn(8, 16))


def _candidate(region, body: str) -> Candidate:
    return Candidate(region.signature, CandidateKind.RULE_BY_EXAMPLE, f"import os\nimport torch\n\n\n{body}", TOL)


def test_a_candidate_that_runs_out_of_device_memory_is_inconclusive_not_rejected():
    region = _region()
    raising = _candidate(region, "def candidate(x):\n    raise torch.OutOfMemoryError('CUDA out of memory. "
                                 "Tried to allocate 144.00 MiB')\n")
    verdict = verify(region, raising, QUICK)
    assert not verdict.accepted and verdict.inconclusive and verdict.failed[0].name == "resources"


def test_a_child_that_dies_out_of_memory_before_reporting_is_inconclusive():
    region = _region()
    dying = _candidate(region, "import sys\n\n\ndef candidate(x):\n    sys.stderr.write('torch.OutOfMemoryError: "
                               "CUDA out of memory. Tried to allocate 54.00 MiB\\n')\n    sys.stderr.flush()\n"
                               "    os._exit(1)\n")
    verdict = verify(region, dying, QUICK)
    assert not verdict.accepted and verdict.inconclusive, verdict.reason


def test_other_failures_stay_rejections():
    region = _region()
    wrong = _candidate(region, "def candidate(x):\n    raise RuntimeError('shape mismatch')\n")
    dead = _candidate(region, "def candidate(x):\n    os._exit(3)\n")
    for candidate in (wrong, dead):
        verdict = verify(region, candidate, QUICK)
        assert not verdict.accepted and not verdict.inconclusive, verdict.reason


def test_the_loop_records_it_as_an_error_and_a_later_run_retries_it_twice_at_most(tmp_path):
    from kopt.agent.bench import BenchConfig
    from kopt.agent.graphs import capture_graphs
    from kopt.agent.loop import evaluate
    from kopt.agent.profile import find_occurrences
    from tests.agent.tiny_models import tiny_block_stack

    model, inputs = tiny_block_stack()
    graphs = capture_graphs(model, inputs, regional=True)
    region = find_occurrences(graphs[0].graph_module)[0].region
    raising = _candidate(region, "def candidate(*args):\n    raise torch.OutOfMemoryError('CUDA out of memory')\n")

    class NoClock:  # never reached: the verifier's answer settles it
        name = "unused"

        def samples(self, *args):
            raise AssertionError("timed a candidate the verifier could not run")

    evaluation = evaluate(raising, region, graphs, {}, NoClock(), QUICK, BenchConfig())
    assert evaluation.status is Status.ERROR and "out of device memory" in evaluation.reason
    kb = KnowledgeBase(tmp_path / "kb.sqlite")
    environment = kb.record_environment()
    kb.record_region(region)
    kb.record_candidate(raising, status=Status.ERROR, reason=evaluation.reason, environment=environment)
    assert not kb.has_evaluated(raising, environment)  # the machine's failure: try it again next run
    kb.record_candidate(raising, status=Status.ERROR, reason=evaluation.reason, environment=environment)
    assert kb.has_evaluated(raising, environment)  # but not forever
    slow = _candidate(region, "def candidate(x):\n    return x * 3.0 + 1.0\n")
    kb.record_candidate(slow, status=Status.SLOWER, reason="no gain", environment=environment)
    assert kb.has_evaluated(slow, environment)


def test_one_trial_that_ran_and_failed_settles_it_even_if_another_ran_out_of_memory():
    from kopt.agent.verify.verdict import CheckResult, decide

    out = CheckResult("resources", False, "out of device memory, not the candidate's verdict: ...", 0)
    wrong = CheckResult("values", False, "rel 0.5 > bound 1e-5", 1)
    assert decide([out], 2, 0.1, "").inconclusive
    for checks in ([out, wrong], [wrong, out]):
        verdict = decide(checks, 2, 0.1, "")
        assert not verdict.accepted and not verdict.inconclusive
