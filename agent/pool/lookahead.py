"""Verify ahead: while the loop times one candidate, the pool verifies the next ones.

Why verifying ahead is valid: a verdict depends on the region, the candidate and the verifier's
settings only (fixed trial seeds included), never on what the loop accepted before, so a verdict
computed early is the verdict the loop would have computed in turn. Only timing (micro and end to
end) depends on what was accepted, and it stays serial, in the loop, on the timing device.

What the loop sees does not change either: candidates come out in proposal order, and proposals are
pulled from the proposer in *batches* (the search proposer's whole ranked list; one batch per region
exchange of the LLM proposer), a new batch only once the loop has taken every candidate of the
ones before, which is exactly when the serial loop would have asked the proposer. A proposer that
reads the knowledge base (the LLM proposer reads lessons) therefore reads it in the same state.
Verification results land in the knowledge base through the loop only, in order. What was verified
ahead but never reached (the budget ran out, ``max_candidates``) is dropped unrecorded.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator

from kopt.agent.candidate import Candidate
from kopt.agent.pool.executor import Executor
from kopt.agent.pool.job import VerifyEvent, VerifyJob, VerifyOutcome

log = logging.getLogger("kopt")


@dataclasses.dataclass
class Ahead:
    """One candidate in proposal order, and its verification if one was started ahead."""

    candidate: Candidate
    future: concurrent.futures.Future[VerifyOutcome] | None = None
    considered: bool = False


def describe(candidate: Candidate) -> str:
    params = ",".join(f"{k}={v}" for k, v in candidate.params[1:] or candidate.params)
    return f"{candidate.kind.value} {params} [{candidate.content_hash[:8]}]"


class Lookahead:
    """Candidates in proposal order, each region candidate's verification submitted ``window``
    candidates before the loop reaches it.

    Args:
        batches: the proposals, batch by batch (module docstring).
        job_for: the verification job of a candidate, or None when the loop will not verify it
            (a pipeline choice, an unknown region, a candidate already in the knowledge base).
        executor: where jobs run.
        window: how many verifications may wait ahead of the loop (queued, running or done).
    """

    def __init__(self, batches: Iterable[list[Candidate]], job_for: Callable[[Candidate], VerifyJob | None],
                 executor: Executor, window: int) -> None:
        self._batches: Iterator[list[Candidate]] = iter(batches)
        self._job_for, self.executor, self.window = job_for, executor, max(1, window)
        self._buffer: collections.deque[Ahead] = collections.deque()
        self._by_hash: dict[str, concurrent.futures.Future[VerifyOutcome]] = {}
        self.events: list[VerifyEvent] = []

    def __iter__(self) -> Lookahead:
        return self

    def __next__(self) -> Ahead:
        while not self._buffer:
            self._buffer.extend(Ahead(c) for c in next(self._batches))  # StopIteration ends the loop
        self._top_up()
        return self._buffer.popleft()

    def _top_up(self) -> None:
        waiting = sum(1 for a in self._buffer if a.future is not None)
        started = []
        for ahead in self._buffer:
            if waiting >= self.window:
                break
            if ahead.considered:
                continue
            ahead.considered = True
            job = self._job_for(ahead.candidate)
            if job is None:
                continue
            key = ahead.candidate.content_hash
            if key not in self._by_hash:
                self._by_hash[key] = self.executor.submit(job)
                started.append(describe(ahead.candidate))
            ahead.future = self._by_hash[key]
            waiting += 1
        if started:
            log.info("agent: verifying ahead on %d %s worker(s): %s", len(self.executor.slots), self.executor.name,
                     "; ".join(started))

    def outcome(self, ahead: Ahead) -> VerifyOutcome | None:
        """Wait for ``ahead``'s verification (None if none was started ahead); a worker that failed
        without reporting (a Ray worker that died) comes back as an outcome with ``error``."""
        if ahead.future is None:
            return None
        try:
            outcome = ahead.future.result()
        except Exception as failure:  # noqa: BLE001 - the worker's failure is this candidate's record
            return VerifyOutcome(None, f"{type(failure).__name__}: {failure}", None)
        if outcome.event is not None and outcome.event not in self.events:
            self.events.append(outcome.event)
        return outcome

    def close(self) -> None:
        self.executor.close()
