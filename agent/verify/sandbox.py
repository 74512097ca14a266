"""Start the child in its own session with a scrubbed environment, bound its time, read its report.

By default the child is forked from a fork server that has torch imported already (a second saved
per candidate); ``fresh_interpreter=True`` starts a new interpreter instead (timing runs do).
The environment holds nothing from the parent's but what a numeric library needs (no API keys, no
proxies, no ``KOPT_CACHE_DIR``: ``HOME`` and ``TMPDIR`` point into the work folder). The child
runs in a new session, so the whole process group is killed when it overruns ``timeout_s`` and
again after it exits (nothing it started survives). Its report is the JSON between two copies of
a nonce the parent sent on stdin: text the candidate prints cannot be mistaken for it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from kopt.agent.verify.workdir import CHILD

_TAIL = 4000


@dataclasses.dataclass(frozen=True)
class ChildRun:
    """What came back from one child process."""

    report: dict | None
    returncode: int | None
    timed_out: bool
    elapsed_s: float
    stderr_tail: str
    stdout_tail: str

    def ended(self) -> str:
        """Why there is no report, for a human."""
        if self.timed_out:
            return f"the process ran past its time limit ({self.elapsed_s:.0f} s) and was killed"
        code = self.returncode
        if code is not None and code < 0:
            return f"the process was killed by signal {signal.Signals(-code).name}"
        return f"the process ended (exit code {code}) before the harness reported"


_GPU_PASS_THROUGH = ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "TRITON_LIBCUDA_PATH", "TRITON_PTXAS_PATH")


def child_environment(root: Path, threads: int, cuda_devices: str | None = None,
                      gpu: bool = False) -> dict[str, str]:
    """The child's whole environment; ``cuda_devices`` (a pool worker's GPU) becomes its
    ``CUDA_VISIBLE_DEVICES``: the fork server never initializes CUDA, so a fork still picks it up.
    A child that times on a GPU (``gpu``) runs Triton compiled, not interpreted, and keeps the
    variables that tell CUDA and Triton where the driver and ``ptxas`` are."""
    interpret = "0" if gpu else os.environ.get("TRITON_INTERPRET", "1")
    pinned = {} if cuda_devices is None else {"CUDA_VISIBLE_DEVICES": cuda_devices}
    if gpu:
        pinned.update({k: os.environ[k] for k in _GPU_PASS_THROUGH if k in os.environ})
    return {**pinned, "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(root / "home"), "TMPDIR": str(root / "home"),
            "LANG": "C.UTF-8", "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "TRITON_INTERPRET": interpret, "TRITON_CACHE_DIR": str(root / "home" / "triton"),
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": str(secrets.randbelow(2**32))}


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _report(text: str, nonce: str) -> dict | None:
    end = text.rfind(nonce)
    start = text.rfind(nonce, 0, end) if end > 0 else -1
    if start < 0:
        return None
    try:
        report = json.loads(text[start + len(nonce): end])
    except json.JSONDecodeError:
        return None
    return report if isinstance(report, dict) else None


def run_child(root: Path, *, timeout_s: float, threads: int, python: str | None = None,
              fresh_interpreter: bool = False, cuda_devices: str | None = None, gpu: bool = False) -> ChildRun:
    """Run the child on the prepared work folder ``root`` and collect its report: forked from the fork
    server (:mod:`kopt.agent.verify.forkserver`), or as a new interpreter with ``fresh_interpreter``
    (required with ``gpu``: CUDA is initialized per process, never inherited through a fork)."""
    if gpu and not fresh_interpreter:
        raise ValueError("a child that runs on a GPU must be a fresh interpreter")
    nonce = secrets.token_hex(16)
    stdout_path, stderr_path = root / "stdout.txt", root / "stderr.txt"
    started = time.monotonic()
    if not fresh_interpreter:
        from kopt.agent.verify.forkserver import server

        template = child_environment(root.parent, threads)
        environment = child_environment(root, threads, cuda_devices)
        returncode, timed_out = server(python, template).run(root, nonce, environment, timeout_s)
        return _collect(stdout_path, stderr_path, nonce, returncode, timed_out, time.monotonic() - started)
    with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
        process = subprocess.Popen([python or sys.executable, "-I", str(CHILD), str(root)], stdin=subprocess.PIPE,
                                   stdout=stdout, stderr=stderr, cwd=str(root / "home"),
                                   env=child_environment(root, threads, cuda_devices, gpu),
                                   start_new_session=True)
        timed_out = False
        try:
            process.stdin.write((nonce + "\n").encode())
            process.stdin.close()
        except BrokenPipeError:
            pass
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(process.pid)
            process.wait()
        _kill_group(process.pid)
    return _collect(stdout_path, stderr_path, nonce, process.returncode, timed_out, time.monotonic() - started)


def _collect(stdout_path: Path, stderr_path: Path, nonce: str, returncode: int | None, timed_out: bool,
             elapsed: float) -> ChildRun:
    text = stdout_path.read_bytes().decode(errors="replace") if stdout_path.exists() else ""
    errors = stderr_path.read_bytes()[-_TAIL:].decode(errors="replace") if stderr_path.exists() else ""
    report = None if timed_out else _report(text, nonce)
    visible = text.replace(nonce, "<nonce>")
    return ChildRun(report, returncode, timed_out, elapsed, errors, visible[-_TAIL:] if report is None else "")
