"""The walls around an untrusted candidate, set up inside the child process before it is loaded.

Loaded by path from :mod:`child` (standard library only; no kopt import in the child). Each layer
says what enforces it, because the difference matters:

* **Network** (kernel): :func:`isolate_network` moves the process into a new user and network
  namespace, which has no interface but a downed loopback: every connect fails. Landlock (below)
  also denies TCP bind/connect where the kernel supports it.
* **Files, ptrace, signals** (kernel, Landlock): :func:`restrict_filesystem` allows reading only the
  Python installation, the site-packages and the paths the parent names (the candidate's file, kopt's
  kernels) and writing nothing; C code (``torch.from_file``, ``numpy.fromfile``) is bound by it too,
  unlike a Python-level hook. A Landlock domain cannot ptrace or signal processes outside it.
* **Resources** (kernel, rlimits): address space, CPU seconds, file size, no core dumps.
* **Operations** (in-process, PEP 578 audit hook): :func:`install_audit_hook` refuses, in every
  thread but the harness's main thread, process creation, sockets, ctypes, gc and cross-thread
  frame introspection, frames of tracebacks and generators, replacing a function's code, file
  writes, reads and directory listings outside the allowed paths, environment changes and imports of the
  verifier. ``sys._getframe`` stays allowed (``typing`` and ``logging`` use it): candidate code runs
  in its own thread, whose stack holds nothing of the harness. A hook cannot be removed from
  Python; native code could bypass it, which is why ctypes is refused and the kernel layers exist.
* **Tampering** (in-process, detected afterwards): :class:`Integrity` snapshots the functions of
  the modules a harness or verifier relies on (``time``, ``torch``, ``torch.Tensor``, builtins, ...)
  and the dispatcher registrations of the ATen ops the harness calls; any change is reported, so a
  candidate that patches a timer or ``torch.allclose`` is rejected even when the patch was harmless.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys

_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_PR_SET_NO_NEW_PRIVS = 38
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_FS_EXECUTE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 2, 1 << 3
_FS_ALL_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_NET_BIND_CONNECT = (1 << 0) | (1 << 1)
_SCOPE_ABSTRACT_UNIX_AND_SIGNAL = (1 << 0) | (1 << 1)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def isolate_network() -> str:
    """Enter a new user + network namespace (must run before any thread starts). Returns a note."""
    uid, gid = os.getuid(), os.getgid()
    libc = _libc()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        return f"network: NOT isolated by the kernel (unshare: {os.strerror(ctypes.get_errno())}); audit hook only"
    for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"{uid} {uid} 1"),
                       ("/proc/self/gid_map", f"{gid} {gid} 1")):
        with open(path, "w") as handle:
            handle.write(text)
    return "network: new network namespace (kernel)"


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def restrict_filesystem(read_paths: list[str]) -> str:
    """Landlock: read-only access to ``read_paths``, nothing else; TCP and signals scoped too where
    the kernel's Landlock ABI has them. Returns a note saying what is enforced."""
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return f"files: NOT restricted by the kernel (no Landlock: {os.strerror(ctypes.get_errno())}); audit hook only"
    attr = _RulesetAttr(_FS_ALL_BY_ABI.get(abi, (1 << 16) - 1), _NET_BIND_CONNECT if abi >= 4 else 0,
                        _SCOPE_ABSTRACT_UNIX_AND_SIGNAL if abi >= 6 else 0)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"files: NOT restricted (landlock_create_ruleset: {os.strerror(ctypes.get_errno())})"
    try:
        for path in read_paths:
            if not os.path.exists(path):
                continue
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                access = _FS_EXECUTE | _FS_READ_FILE | (_FS_READ_DIR if os.path.isdir(path) else 0)
                rule = _PathBeneath(access, fd)
                if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule),
                                ctypes.c_uint32(0)) != 0:
                    return f"files: NOT restricted (landlock_add_rule {path}: {os.strerror(ctypes.get_errno())})"
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"files: NOT restricted (no_new_privs: {os.strerror(ctypes.get_errno())})"
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return f"files: NOT restricted (landlock_restrict_self: {os.strerror(ctypes.get_errno())})"
    finally:
        os.close(ruleset)
    extras = (", TCP bind/connect denied" if abi >= 4 else "") + (", signals scoped" if abi >= 6 else "")
    return f"files: read-only allow-list, no writes (Landlock ABI {abi}, kernel){extras}"


def limit_resources(memory_bytes: int | None, cpu_seconds: int, file_bytes: int) -> str:
    """Address space (on top of what is mapped now; None: no limit, as CUDA needs), CPU time, file
    size; no core dumps."""
    with open("/proc/self/statm") as handle:
        mapped = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limits = [(resource.RLIMIT_CPU, cpu_seconds), (resource.RLIMIT_FSIZE, file_bytes), (resource.RLIMIT_CORE, 0)]
    if memory_bytes is not None:
        limits.append((resource.RLIMIT_AS, mapped + memory_bytes))
    for kind, value in limits:
        resource.setrlimit(kind, (value, value))
    space = "no address-space limit" if memory_bytes is None else f"+{memory_bytes >> 20} MiB address space"
    return f"resources: {space}, {cpu_seconds} s CPU, {file_bytes >> 20} MiB files (rlimits, kernel)"


_DENIED_EVENTS = frozenset({
    "os.system", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.kill", "os.killpg",
    "subprocess.Popen", "pty.spawn", "signal.pthread_kill", "sys._current_frames",
    "sys.settrace", "sys.setprofile", "sys.addaudithook", "gc.get_objects", "gc.get_referrers",
    "gc.get_referents", "os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
    "os.symlink",
    "os.link", "os.utime", "os.putenv", "os.unsetenv", "os.chdir", "mmap.__new__", "resource.setrlimit",
    "resource.prlimit", "builtins.input", "webbrowser.open", "urllib.Request", "http.client.connect",
    "sqlite3.connect", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr", "shutil.rmtree",
    "shutil.copyfile", "shutil.move", "shutil.chown", "tempfile.mkstemp", "tempfile.mkdtemp",
})
_DENIED_PREFIXES = ("socket.", "ctypes.", "os.exec", "os.spawn", "os.posix_spawn", "cpython.run_", "shutil.")
_DENIED_IMPORTS = ("ctypes", "_ctypes", "subprocess", "_posixsubprocess", "multiprocessing", "socket", "_socket",
                   "ssl", "_ssl", "asyncio", "urllib.request", "http.client", "ftplib", "smtplib", "pty", "mmap",
                   "sqlite3", "_sqlite3", "kopt.agent")


_FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})


class AuditRecorder:
    """What the audit hook refused, in order (the harness reports it; the candidate cannot clear it:
    it holds no reference to this object)."""

    def __init__(self) -> None:
        self.violations: list[str] = []


def install_audit_hook(main_thread: int, read_prefixes: list[str]) -> AuditRecorder:
    """Refuse the operations above in every thread except ``main_thread`` (the harness), record each
    refusal, and raise PermissionError in the offending thread (so the refusal also stops it)."""
    import _thread

    recorder = AuditRecorder()
    get_ident, violations, realpath = _thread.get_ident, recorder.violations, os.path.realpath
    prefixes = tuple(realpath(p) for p in read_prefixes)

    def refuse(event: str, detail: str) -> None:
        if len(violations) < 50:
            violations.append(f"{event} {detail}"[:300])
        raise PermissionError(f"kopt verifier sandbox: {event} is not allowed")

    def hook(event: str, args: tuple) -> None:
        if get_ident() == main_thread:
            return
        if event == "open":
            path, mode = args[0], args[1]
            if not isinstance(path, (str, bytes)):
                refuse(event, f"file descriptor {path!r}")
            path = realpath(os.fsdecode(path))
            writing = isinstance(mode, str) and any(c in mode for c in "wax+")
            if writing or (isinstance(mode, int) and mode & (os.O_WRONLY | os.O_RDWR)):
                refuse(event, f"{path} for writing")
            if not path.startswith(prefixes):
                refuse(event, path)
        elif event in ("os.listdir", "os.scandir", "glob.glob", "glob.glob/2"):  # imports list package folders
            path = args[0] if args and isinstance(args[0], (str, bytes)) else "."
            folder = realpath(os.fsdecode(path).split("*")[0] or ".")
            if not folder.startswith(prefixes):
                refuse(event, folder)
        elif event == "object.__getattr__":  # raised for code/defaults too: library code reads those
            if args[1] in _FRAME_ATTRIBUTES:
                refuse(event, f"{type(args[0]).__name__}.{args[1]}")
        elif event == "object.__setattr__":
            if args[1] == "__code__":
                refuse(event, "replacing a function's code")
        elif event == "import":
            name = str(args[0])
            if any(name == d or name.startswith(d + ".") for d in _DENIED_IMPORTS):
                refuse(event, name)
        elif event in _DENIED_EVENTS or event.startswith(_DENIED_PREFIXES):
            refuse(event, repr(args)[:200])

    sys.addaudithook(hook)
    return recorder


# Bound once at load: the integrity check runs after candidate code, which may have replaced
# ``builtins.callable`` and friends (this module is never in ``sys.modules``, so these stay ours).
_vars, _callable, _isinstance, _dict, _list, _sorted, _set, _module = vars, callable, isinstance, dict, list, \
    sorted, set, type(sys)


def _public_functions(namespace: object) -> dict[str, object]:
    found = {}
    for name, value in _list(_vars(namespace).items()):
        if _callable(value) or _isinstance(value, _module):
            found[name] = value
    return found


class Integrity:
    """Identity snapshot of functions and classes in watched namespaces, and of dispatcher entries."""

    MODULES = ("builtins", "time", "os", "sys", "gc", "threading", "_thread", "math", "json", "torch",
               "torch.nn.functional", "torch.testing", "torch.cuda", "torch.library", "torch.overrides", "numpy")
    DISPATCHED = ("aten::copy_", "aten::clone", "aten::full", "aten::as_strided", "aten::view", "aten::fill_",
                  "aten::empty.memory_format", "aten::empty_strided", "aten::equal", "aten::allclose", "aten::isfinite",
                  "aten::sub.Tensor",
                  "aten::abs", "aten::max", "aten::eq.Tensor", "aten::set_.source_Storage_storage_offset")

    def __init__(self, torch: object) -> None:
        self.torch = torch
        self.spaces = {name: sys.modules[name] for name in self.MODULES if name in sys.modules}
        self.spaces["torch.Tensor"] = torch.Tensor  # type: ignore[attr-defined]
        self.spaces["torch.UntypedStorage"] = torch.UntypedStorage  # type: ignore[attr-defined]
        self.before = {name: _public_functions(space) for name, space in self.spaces.items()}
        self.modules = _dict(sys.modules)
        self.dispatch = {op: self._dump(op) for op in self.DISPATCHED}

    def _dump(self, op: str) -> str:
        try:
            return self.torch._C._dispatch_dump(op)  # type: ignore[attr-defined]
        except Exception as error:  # noqa: BLE001 - an op name unknown to this torch
            return f"unavailable: {type(error).__name__}"

    def changes(self) -> list[str]:
        """Every watched name that now points elsewhere, was added or removed."""
        found = []
        for name, space in self.spaces.items():
            if sys.modules.get(name, space) is not space and name in self.modules:
                found.append(f"sys.modules[{name!r}] replaced")
            now, before = _public_functions(space), self.before[name]
            for attr in _sorted(_set(now) | _set(before)):
                if now.get(attr) is before.get(attr):
                    continue
                if attr not in before and _isinstance(now[attr], _module):
                    continue  # a submodule imported since (``import torch.distributions``): not a patch
                verb = "added" if attr not in before else ("removed" if attr not in now else "replaced")
                found.append(f"{name}.{attr} {verb}")
        found += [f"dispatcher entry of {op} changed" for op, dump in self.dispatch.items() if self._dump(op) != dump]
        return found
