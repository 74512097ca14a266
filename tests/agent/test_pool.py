"""The verification pool: region candidates verified ahead by local workers while the loop times
the current one; the knowledge base ends up as a serial run leaves it (CPU, cost-model clock)."""

from __future__ import annotations

import os
import signal
import sys

import pytest
import torch

from kopt.agent import optimize
from kopt.agent import region as regions
from kopt.agent.candidate import Candidate, CandidateKind
from kopt.agent.kb import Status
from kopt.agent.pool import AUTO, VerifyJob, WorkerSlot, make_executor, most_in_flight, plan_workers, run_job
from kopt.agent.pool.job import travels
from kopt.agent.pool.local import LocalExecutor, WorkerDied
from kopt.agent.pool.workers import parse_workers, visible_gpus
from kopt.agent.propose.llm import LLMProposer
from kopt.agent.verify import VerifyConfig
from kopt.passes.base import Contract
from tests.agent.pool_helpers import BLOCK_CANDIDATES, HANG, block_run, kb_outcomes, write_bad_recordings
from tests.agent.tiny_models import sigmoid_gelu_mlp

QUICK = VerifyConfig(seed=0, shape_trials=1, timeout_s=60, call_timeout_s=3)


@pytest.fixture(scope="module")
def serial_and_pooled(tmp_path_factory):
    """The same seeded run twice: verification inline (the default on the CPU) and on two local workers."""
    folder = tmp_path_factory.mktemp("pool")
    serial = block_run(folder / "serial.sqlite")
    pooled = block_run(folder / "pooled.sqlite", workers=2)
    return (serial, folder / "serial.sqlite"), (pooled, folder / "pooled.sqlite")


def test_auto_is_one_worker_per_gpu_without_the_timing_gpu():
    """Four GPUs, timing on ordinal 1: three workers on the others; one GPU, or timing on the CPU: one
    worker competing with the timing (the inline case); a count spreads over the worker GPUs."""
    four = plan_workers(AUTO, ["0", "1", "2", "3"], 1)
    assert [s.cuda_devices for s in four] == ["0", "2", "3"] and not any(s.shares_timing_device for s in four)
    assert plan_workers(AUTO, ["0"], 0) == (WorkerSlot(0, "0", True),)
    assert plan_workers(AUTO, [], None) == (WorkerSlot(0, None, True),)
    assert plan_workers(AUTO, ["0", "1"], None) == (WorkerSlot(0, None, True),)
    assert [s.cuda_devices for s in plan_workers(3, ["4", "6"], 0)] == ["6", "6", "6"]
    assert [s.cuda_devices for s in plan_workers(2, ["4", "6", "7"], None)] == ["4", "6"]
    assert [s.cuda_devices for s in plan_workers(3, [], None)] == [None, None, None]
    with pytest.raises(ValueError, match="positive integer"):
        plan_workers(0, [], None)
    assert parse_workers("auto") == AUTO and parse_workers("3") == 3
    with pytest.raises(ValueError):
        parse_workers("two")


def test_physical_gpu_names_come_from_cuda_visible_devices(monkeypatch):
    """A worker's child must see the parent's GPU k, i.e. the k-th entry of CUDA_VISIBLE_DEVICES."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    assert visible_gpus(2) == ["5", "7"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpus(2) == ["0", "1"]


def test_the_local_default_is_inline_and_a_count_makes_a_pool():
    """One worker that shares the timing device verifies inline (the loop as before); two make a pool."""
    assert make_executor("local", AUTO, None, gpus=[]) is None
    assert make_executor("local", AUTO, 0, gpus=["0"]) is None
    pool = make_executor("local", 2, None, gpus=[])
    try:
        assert pool.name == "local" and len(pool.slots) == 2 and pool.shares_timing_device  # CPU timing
    finally:
        pool.close()
    beside = make_executor("local", AUTO, 0, gpus=["0", "1"])
    try:
        assert [s.cuda_devices for s in beside.slots] == ["1"] and not beside.shares_timing_device
    finally:
        beside.close()
    with pytest.raises(ValueError, match="executor"):
        make_executor("dask", 2, None, gpus=[])


def test_a_workers_sandbox_child_sees_only_its_gpu():
    """The child of a worker pinned to GPU "3" has CUDA_VISIBLE_DEVICES=3 (the candidate computes the
    right answer only then); the same candidate under a worker pinned to "5" is rejected."""
    region = regions.from_function(lambda x: x * 3.0 + 1.0, torch.randn(8, 16))
    pinned = Candidate(region.signature, CandidateKind.RULE_BY_EXAMPLE,
                       "import os\n\n\ndef candidate(x):\n    assert os.environ['CUDA_VISIBLE_DEVICES'] == '3'\n"
                       "    return x * 3.0 + 1.0\n", Contract.tolerance(1e-5))
    job = VerifyJob.of(region, pinned, QUICK)
    on_three, on_five = run_job(job, "local-0", "3"), run_job(job.portable(), "local-1", "5")
    assert on_three.error == "" and on_three.verdict.accepted, on_three.verdict.reason
    assert on_five.error == "" and not on_five.verdict.accepted and "AssertionError" in on_five.verdict.reason
    assert on_three.event.device == "cuda:3" and on_three.event.ended > on_three.event.started


def test_every_region_of_the_run_travels_to_a_worker(serial_and_pooled):
    """Each region the pooled run verified rebuilds from its source with its signature (so workers in
    other processes verify the very region the loop would have)."""
    _, (pooled, _) = serial_and_pooled
    assert pooled.occurrences and all(travels(o.region) for o in pooled.occurrences)


def test_two_workers_leave_the_knowledge_base_as_a_serial_run(serial_and_pooled):
    """Same seed, same candidates in the same order with the same statuses and reasons, verified ahead
    by two workers instead of inline."""
    (serial, serial_kb), (pooled, pooled_kb) = serial_and_pooled
    assert serial.pool == "inline" and serial.verified_ahead == []
    assert pooled.pool == "2 local worker(s)"
    assert len(serial.evaluations) == BLOCK_CANDIDATES
    assert kb_outcomes(pooled_kb) == kb_outcomes(serial_kb)
    assert [(e.candidate.content_hash, e.status) for e in pooled.evaluations] == \
           [(e.candidate.content_hash, e.status) for e in serial.evaluations]
    assert {e.status for e in pooled.evaluations} >= {Status.ACCEPTED, Status.SLOWER}
    assert pooled.accepted == serial.accepted


def test_two_candidates_were_verified_at_once(serial_and_pooled):
    """The start and end times the workers recorded show two verifications in flight together, on
    both workers, and every region candidate the loop evaluated was verified ahead."""
    _, (pooled, _) = serial_and_pooled
    events = pooled.verified_ahead
    region_candidates = {e.candidate.content_hash for e in pooled.evaluations
                         if e.candidate.kind is not CandidateKind.PASS_CHOICE}
    assert region_candidates and region_candidates <= {e.candidate for e in events}
    assert {e.worker for e in events} == {"local-0", "local-1"}
    assert len({e.process for e in events}) == 2 and os.getpid() not in {e.process for e in events}
    assert most_in_flight(events) == 2
    assert any(a.started < b.ended and b.started < a.ended for a in events for b in events if a is not b)
    assert "verified ahead of the timing, at most 2 at once" in pooled.table()


def test_a_hanging_or_crashing_candidate_is_rejected_and_the_run_goes_on(tmp_path):
    """A candidate that sleeps forever and one that aborts its process are verified side by side; each
    is rejected with the sandbox's reason, and the honest candidate after them is still accepted."""
    model, inputs = sigmoid_gelu_mlp()
    replay = write_bad_recordings(tmp_path / "recordings")
    result = optimize(model, inputs, budget_min=5, proposer="llm", llm=LLMProposer(replay=replay),
                      kb_path=tmp_path / "kb.sqlite", clock="cost-model", verify_config=QUICK, workers=2,
                      progress=False)
    hang, crash, honest = result.evaluations
    assert hang.status is Status.REJECTED and "did not return within 3 s" in hang.reason, hang.reason
    assert crash.status is Status.REJECTED and "SIGABRT" in crash.reason, crash.reason
    assert honest.status is Status.ACCEPTED, honest.reason
    assert most_in_flight(result.verified_ahead) >= 2
    assert [r[1] for r in kb_outcomes(tmp_path / "kb.sqlite")] == ["rejected", "rejected", "accepted"]


def test_a_worker_that_fails_records_an_error_and_the_run_goes_on(tmp_path):
    """Workers whose sandbox interpreter does not exist fail to verify anything: each region candidate
    is recorded as an error naming the failure, and the run still evaluates the rest."""
    model, inputs = sigmoid_gelu_mlp()
    broken = VerifyConfig(seed=0, shape_trials=1, python=str(tmp_path / "no-such-python"))
    result = optimize(model, inputs, budget_min=5, kb_path=tmp_path / "kb.sqlite", clock="cost-model",
                      verify_config=broken, workers=2, max_candidates=4, progress=False, pipelines=False)
    region_evaluations = [e for e in result.evaluations if e.candidate.kind is not CandidateKind.PASS_CHOICE]
    assert len(result.evaluations) == 4 and region_evaluations
    for evaluation in region_evaluations:
        assert evaluation.status is Status.ERROR
        assert "verification failed in the worker: FileNotFoundError" in evaluation.reason, evaluation.reason
    assert len(kb_outcomes(tmp_path / "kb.sqlite")) == 4


def test_a_worker_process_that_dies_fails_its_job_and_is_started_again():
    """A worker process killed while it holds a job fails that job with the signal named; the next
    job runs on a fresh worker process and is verified as usual."""
    region = regions.from_function(lambda x: x * 3.0 + 1.0, torch.randn(8, 16))
    honest = Candidate(region.signature, CandidateKind.RULE_BY_EXAMPLE,
                       "def candidate(x):\n    return x * 3.0 + 1.0\n", Contract.tolerance(1e-5))
    hang = Candidate(region.signature, CandidateKind.RULE_BY_EXAMPLE, HANG.replace("in0", "x"),
                     Contract.tolerance(1e-5))
    pool = LocalExecutor(plan_workers(1, [], None))
    try:
        before = pool.submit(VerifyJob.of(region, honest, QUICK)).result(timeout=120)
        first = pool.workers[0].process.pid
        held = pool.submit(VerifyJob.of(region, hang, QUICK))
        os.kill(first, signal.SIGKILL)
        with pytest.raises(WorkerDied, match="local-0 died \\(killed by signal SIGKILL\\)"):
            held.result(timeout=120)
        after = pool.submit(VerifyJob.of(region, honest, QUICK)).result(timeout=120)
    finally:
        pool.close()
    assert before.verdict.accepted and before.event.process == first
    assert after.error == "" and after.verdict.accepted, after.verdict.reason
    assert after.event.process not in (first, os.getpid())


def test_ray_missing_names_the_extra(monkeypatch):
    """Without Ray, asking for its executor says which extra to install."""
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where it is not installed
    with pytest.raises(ImportError, match=r"kopt\[ray\]"):
        make_executor("ray", 2, None, gpus=[])
