"""The fork server: a pristine interpreter with torch imported, forked once per verification.

Run as ``python -I zygote.py CHILD_PY`` by :mod:`kopt.agent.verify.forkserver`. Importing torch
costs a second or more; forking this process costs milliseconds, and the fork is as clean as a new
interpreter for what matters here: this process never runs candidate code, never runs a torch op
(no thread pool to inherit), never initializes CUDA, and never imports kopt. Each fork starts a new
session, points its stdio at the work folder, closes every other descriptor (the server's pipes
included, so a candidate cannot talk to the server) and runs :func:`child.run`.

Protocol, one JSON object per line. In: ``{"id", "workdir", "nonce", "env"}``. Out: ``{"id", "pid"}``
once forked, ``{"id", "status"}`` (the raw wait status) once the fork has been reaped. The server
is single-threaded (a select loop over stdin and a SIGCHLD wake-up pipe), so every fork is taken
from a one-thread process.
"""

import importlib.util
import json
import os
import select
import signal
import sys

import torch  # noqa: F401 - imported once here so that every fork has it

try:  # the Triton interpreter for triton-kernel candidates, when installed
    import numpy  # noqa: F401
    import triton  # noqa: F401
    import triton.language  # noqa: F401
except ImportError:
    pass


def _load_child(path):
    spec = importlib.util.spec_from_file_location("kopt_verify_child", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _become_child(child, request):
    """In the fork: a new session, stdio in the work folder, nothing else open; then run."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    workdir = request["workdir"]
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(os.path.join(workdir, "stdout.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(os.path.join(workdir, "stderr.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for source, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(source, target)
    os.closerange(3, 65536)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(os.path.join(workdir, "home"))
    try:
        child.run(workdir, request["nonce"])
    finally:
        os._exit(70)  # run() exits itself; reaching here means the harness failed


def main():
    child = _load_child(sys.argv[1])
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    ids, buffer = {}, b""

    def send(message):
        os.write(1, (json.dumps(message) + "\n").encode())

    while True:
        ready, _, _ = select.select([0, wake_read], [], [])
        if wake_read in ready:
            os.read(wake_read, 4096)
        while ids:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            send({"id": ids.pop(pid, None), "status": status})
        if 0 in ready:
            data = os.read(0, 65536)
            if not data:
                return
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _become_child(child, request)
                ids[pid] = request["id"]
                send({"id": request["id"], "pid": pid})


if __name__ == "__main__":
    main()
