"""The verification pool: region candidates verified by workers ahead of the serial timing.

    kopt optimize flux2 --workers 2                 # two local worker processes
    kopt optimize flux2 --executor ray              # Ray tasks (pip install 'kopt[ray]')

Files, each one concept: :mod:`.workers` (how many workers, which GPU each one's children see),
:mod:`.job` (one verification as a worker runs it, and the times it records), :mod:`.executor` (the
one interface, and which executor a run gets), :mod:`.local` (worker processes; :mod:`.worker_main`
is one, :mod:`.frames` what they exchange), :mod:`.ray_tasks` (Ray tasks), :mod:`.lookahead` (the
window of candidates verified ahead, and why that is valid).
"""

from kopt.agent.pool.executor import EXECUTORS, Executor, make_executor, timing_gpu
from kopt.agent.pool.job import VerifyEvent, VerifyJob, VerifyOutcome, most_in_flight, run_job, travels
from kopt.agent.pool.lookahead import Ahead, Lookahead
from kopt.agent.pool.workers import AUTO, WorkerSlot, parse_workers, plan_workers, visible_gpus

__all__ = ["AUTO", "EXECUTORS", "Ahead", "Executor", "Lookahead", "VerifyEvent", "VerifyJob", "VerifyOutcome",
           "WorkerSlot", "make_executor", "most_in_flight", "parse_workers", "plan_workers", "run_job", "timing_gpu",
           "travels", "visible_gpus"]
