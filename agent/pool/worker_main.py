"""A local pool worker: ``python -m kopt.agent.pool.worker_main NAME [CUDA_VISIBLE_DEVICES]``.

Reads :class:`~kopt.agent.pool.job.VerifyJob` frames on stdin (:mod:`.frames`), verifies each with
:func:`~kopt.agent.pool.job.run_job` (its sandbox children pinned to the GPU given), and writes the
:class:`~kopt.agent.pool.job.VerifyOutcome` back; exits at the end of stdin. Replies go to a private
copy of the original stdout, and descriptor 1 is pointed at stderr before kopt is imported, so
nothing a library prints can land inside a frame.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    name, cuda_devices = argv[0], (argv[1] if len(argv) > 1 else None)
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    from kopt.agent.pool.frames import receive, send
    from kopt.agent.pool.job import run_job

    while (job := receive(sys.stdin.buffer)) is not None:
        send(replies, run_job(job, name, cuda_devices))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
