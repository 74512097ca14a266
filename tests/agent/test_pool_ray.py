"""The verification pool through Ray: tasks on a local Ray instance verify ahead of the serial timing,
and the knowledge base (written by the driver only) ends up as a serial run leaves it."""

from __future__ import annotations

import os

import pytest

from kopt.agent import optimize
from kopt.agent.kb import Status
from kopt.agent.pool import most_in_flight
from kopt.agent.propose.llm import LLMProposer
from kopt.agent.verify import VerifyConfig
from tests.agent.pool_helpers import BLOCK_CANDIDATES, block_run, kb_outcomes, write_bad_recordings
from tests.agent.tiny_models import sigmoid_gelu_mlp

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'kopt[ray]'; the test extra has it)")


@pytest.fixture(scope="module")
def local_ray():
    """Two CPUs of this machine as a Ray cluster, for this module only."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def test_without_a_running_ray_the_run_starts_its_own_and_stops_it(tmp_path):
    """No Ray yet: the run starts a local one with as many CPUs as workers asked for, verifies there
    (tasks still queued when it stops are cancelled) and shuts it down at the end."""
    assert not ray.is_initialized()
    model, inputs = sigmoid_gelu_mlp()
    result = optimize(model, inputs, budget_min=5, kb_path=tmp_path / "kb.sqlite", clock="cost-model",
                      executor="ray", workers=2, max_candidates=2, progress=False, pipelines=False)
    assert result.pool == "2 ray worker(s)" and len(result.evaluations) == 2
    assert result.verified_ahead and os.getpid() not in {e.process for e in result.verified_ahead}
    assert not ray.is_initialized()


def test_ray_tasks_leave_the_knowledge_base_as_a_serial_run(local_ray, tmp_path):
    """Same seed: the same records as the inline run, verified by Ray worker processes (two of them,
    at once), and Ray still running afterwards (the run did not start it, so it does not stop it)."""
    serial = block_run(tmp_path / "serial.sqlite")
    pooled = block_run(tmp_path / "ray.sqlite", executor="ray")
    assert pooled.pool == "2 ray worker(s)" and len(pooled.evaluations) == BLOCK_CANDIDATES
    assert kb_outcomes(tmp_path / "ray.sqlite") == kb_outcomes(tmp_path / "serial.sqlite")
    assert [e.status for e in pooled.evaluations] == [e.status for e in serial.evaluations]
    processes = {e.process for e in pooled.verified_ahead}
    assert len(processes) >= 2 and os.getpid() not in processes
    assert all(e.worker == f"ray-{e.process}" for e in pooled.verified_ahead)
    assert most_in_flight(pooled.verified_ahead) == 2
    assert local_ray.is_initialized()


def test_a_hanging_or_crashing_candidate_in_a_ray_task_is_rejected(local_ray, tmp_path):
    """In Ray tasks too, a candidate that hangs and one that aborts are rejected with the sandbox's
    reason and the honest one after them is accepted."""
    model, inputs = sigmoid_gelu_mlp()
    replay = write_bad_recordings(tmp_path / "recordings")
    quick = VerifyConfig(seed=0, shape_trials=1, timeout_s=60, call_timeout_s=3)
    result = optimize(model, inputs, budget_min=5, proposer="llm", llm=LLMProposer(replay=replay),
                      kb_path=tmp_path / "kb.sqlite", clock="cost-model", verify_config=quick, executor="ray",
                      progress=False)
    hang, crash, honest = result.evaluations
    assert hang.status is Status.REJECTED and "did not return within 3 s" in hang.reason, hang.reason
    assert crash.status is Status.REJECTED and "SIGABRT" in crash.reason, crash.reason
    assert honest.status is Status.ACCEPTED, honest.reason
    assert [r[1] for r in kb_outcomes(tmp_path / "kb.sqlite")] == ["rejected", "rejected", "accepted"]
