"""The parent's side of the fork server (:mod:`zygote`): start it once, ask it for children.

One server per parent process, shared by every verification thread: requests go out under a lock,
and a reader thread hands each reply to the thread waiting for that request id. A child is killed
by process group (it leads its own session), exactly like one the parent spawned itself. If the
server dies, the next request starts a new one.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from kopt.agent.verify.workdir import CHILD

ZYGOTE = Path(__file__).with_name("zygote.py")


class _Pending:
    def __init__(self) -> None:
        self.pid: int | None = None
        self.status: int | None = None
        self.changed = threading.Condition()


class ForkServer:
    """A running zygote process and the replies it sends."""

    def __init__(self, python: str, env: dict[str, str]) -> None:
        self.process = subprocess.Popen([python, "-I", str(ZYGOTE), str(CHILD)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                        start_new_session=True)
        self.lock = threading.Lock()
        self.pending: dict[int, _Pending] = {}
        self.next_id = 0
        threading.Thread(target=self._read, name="kopt-verify-forkserver", daemon=True).start()

    def alive(self) -> bool:
        return self.process.poll() is None

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                reply = json.loads(line)
            except json.JSONDecodeError:
                continue
            pending = self.pending.get(reply.get("id"))
            if pending is None:
                continue
            with pending.changed:
                if "pid" in reply:
                    pending.pid = int(reply["pid"])
                if "status" in reply:
                    pending.status = int(reply["status"])
                pending.changed.notify_all()
        for pending in list(self.pending.values()):  # the server is gone: wake every waiter
            with pending.changed:
                pending.changed.notify_all()

    def run(self, root: Path, nonce: str, env: dict[str, str], timeout_s: float) -> tuple[int | None, bool]:
        """Fork a child on work folder ``root``; wait for it at most ``timeout_s``. Returns (exit code as
        ``Popen.returncode`` gives it, timed out)."""
        with self.lock:
            request_id, self.next_id = self.next_id, self.next_id + 1
            pending = self.pending[request_id] = _Pending()
            message = json.dumps({"id": request_id, "workdir": str(root), "nonce": nonce, "env": env}) + "\n"
            self.process.stdin.write(message.encode())
            self.process.stdin.flush()
        deadline = time.monotonic() + timeout_s
        timed_out = False
        with pending.changed:
            while pending.status is None and self.alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                pending.changed.wait(timeout=min(left, 1.0))
            if timed_out:
                give_up = time.monotonic() + 10.0  # the fork's pid is normally back within milliseconds
                while pending.pid is None and self.alive() and time.monotonic() < give_up:
                    pending.changed.wait(timeout=0.1)
                if pending.pid is not None:
                    _kill_group(pending.pid)
                while pending.pid is not None and pending.status is None and self.alive():
                    pending.changed.wait(timeout=1.0)
        if pending.pid is not None:
            _kill_group(pending.pid)
        self.pending.pop(request_id, None)
        status = pending.status
        return (os.waitstatus_to_exitcode(status) if status is not None else None), timed_out

    def stop(self) -> None:
        if self.alive():
            _kill_group(self.process.pid)
            self.process.wait()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_SERVERS: dict[str, ForkServer] = {}
_SERVERS_LOCK = threading.Lock()


def server(python: str | None, env: dict[str, str]) -> ForkServer:
    """The fork server for ``python`` (started on first use, restarted if it died)."""
    python = python or sys.executable
    with _SERVERS_LOCK:
        current = _SERVERS.get(python)
        if current is None or not current.alive():
            current = _SERVERS[python] = ForkServer(python, env)
        return current


@atexit.register
def _stop_all() -> None:
    for current in list(_SERVERS.values()):
        current.stop()
