"""The verifier's child process: load one untrusted candidate behind the walls and call it.

Run as ``python -I child.py WORKDIR`` with the nonce on stdin, or forked from the fork server
(:mod:`zygote`, which has torch imported already) with the same arguments; reads
``WORKDIR/manifest.json`` (written by :mod:`kopt.agent.verify.workdir`). Standard library and torch
only: the child never imports kopt, and never sees a reference output (the parent computes
references after the child has exited), so there is nothing in it to read or copy.

Order matters, and each step says why it sits where it does:

1. read the manifest and the nonce (before any untrusted code: the nonce frames the report, so a
   candidate that writes to stdout cannot forge it);
2. leave the network namespace (the kernel allows it only while the process has one thread);
3. import torch and warm it up (its lazy initialization must not need files the walls hide);
4. map inputs and output slots from the parent's files (after the walls no file can be opened);
5. rlimits, Landlock, integrity snapshot, then bind every function this thread will call later,
   then the audit hook (it polices every thread but this one);
6. import the candidate and call it **in a runner thread**: a frame walk from candidate code ends
   in that thread's small loop and never reaches this thread's state (timer, nonce, slots);
7. after each call, before touching anything the candidate returned: stop the clock, switch gc off
   again, refuse if a thread is left running (it could change state under this thread) or if any
   watched function or dispatcher entry changed; then check the returned objects' exact types (a
   tensor or tuple subclass would run candidate code in this thread) and copy them to snapshots;
8. at the end: wait, copy what the candidate returned once more (late writes, reused buffers),
   write the report with the nonce, ``os._exit`` (no atexit hooks, no finalizers).

On a GPU (``manifest["device"]`` is ``cuda:N``; timing only, never verification) the harness copies
each input set to the device before the candidate loads, synchronizes the whole device after every
call before it stops the clock (work left on a side stream is timed), and copies the device inputs
back into their files at the end (a write into an input reaches the parent's byte comparison). The
address-space limit, Landlock and the audit hook stay off there: CUDA reserves far more address
space than the limit allows, and Triton's JIT writes its cache and runs ``ptxas`` as a process. That
is no weaker than what follows: a timed candidate has passed the walled CPU verification, and the
end-to-end A/B runs it inside the model's own process.
"""

import _thread
import gc
import importlib.util
import json
import os
import sys
import time


def _load_guard(path):
    spec = importlib.util.spec_from_file_location("kopt_verify_guard", path)
    module = importlib.util.module_from_spec(spec)  # deliberately not in sys.modules
    spec.loader.exec_module(module)
    return module


class Runner:
    """Calls functions in one worker thread; the main thread waits with a timeout. Locks from
    ``_thread`` are C objects, so a candidate cannot patch how the harness waits for it."""

    def __init__(self):
        self.go, self.done = _thread.allocate_lock(), _thread.allocate_lock()
        self.go.acquire()
        self.done.acquire()
        self.box = [None, None, None, None]
        _thread.start_new_thread(self._loop, ())

    def _loop(self):
        while True:
            self.go.acquire()
            fn, args, kwargs = self.box[0], self.box[1], self.box[2]
            try:
                value = fn(*args, **kwargs)
                self.box[3] = (True, value, "")
            except BaseException as error:  # noqa: BLE001 - anything the candidate raises is its result
                try:
                    text = f"{type(error).__name__}: {error}"[:500]
                except BaseException:  # noqa: BLE001 - an exception whose str raises
                    text = "an exception that cannot be printed"
                self.box[3] = (False, None, text)
            self.done.release()

    def call(self, fn, args, kwargs, timeout):
        self.box[0], self.box[1], self.box[2], self.box[3] = fn, args, kwargs, None
        self.go.release()
        return self.box[3] if self.done.acquire(timeout=timeout) else "timeout"


def _import_candidate(path):
    spec = importlib.util.spec_from_file_location("kopt_candidate", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["kopt_candidate"] = module
    spec.loader.exec_module(module)
    return vars(module)


def _to_device(torch, tensor, device):
    """A copy of ``tensor`` on ``device`` with the same sizes and strides (broadcast dims stay)."""
    copy = torch.empty_strided(tuple(tensor.size()), tuple(tensor.stride()), dtype=tensor.dtype, device=device)
    return copy.copy_(tensor)


def _poisoned_like(torch, tensor, device):
    """An ``out=`` buffer on ``device`` laid out like its file slot and poisoned as the slot is."""
    buffer = torch.empty_strided(tuple(tensor.size()), tuple(tensor.stride()), dtype=tensor.dtype, device=device)
    return buffer.fill_(float("nan") if buffer.is_floating_point() else 7)


def _setup(manifest):
    """Steps 2-4: network, torch, mapped slots. Returns (torch, notes, sets, calls)."""
    guard = _load_guard(manifest["guard"])
    notes = [guard.isolate_network()]
    import torch

    for name in manifest["preimport"]:
        try:
            importlib.import_module(name)
        except ImportError:
            notes.append(f"preimport {name}: not installed")
    lowered = "torch._inductor.compile_fx" in manifest["preimport"]  # the region as torch.compile lowers it
    if lowered:
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1  # compile in the calling thread: no worker pool outlives the call
    torch.set_num_threads(manifest["threads"])
    torch.set_grad_enabled(False)
    (torch.ones(64) @ torch.ones(64)).item()
    device = manifest["device"]
    if device != "cpu":  # CUDA, cuBLAS and the caching allocator start here, not inside a timed call
        torch.cuda.set_device(device)
        square = torch.ones(64, 64, device=device, dtype=torch.bfloat16)
        (square @ square).float().sum().item()
    if lowered and device != "cpu":  # threads Dynamo, Inductor, Triton start on a first compile: before the baseline
        torch.compile(lambda t: t * 2 + 1)(torch.ones(8, device=device)).sum().item()

    def mapped(path, nbytes):
        return torch.from_file(path, shared=True, size=max(nbytes, 1), dtype=torch.uint8)

    def view(storage, slot):
        flat = storage[slot["offset"]: slot["offset"] + slot["nbytes"]].view(getattr(torch, slot["dtype"]))
        return flat.as_strided(slot["shape"], slot["stride"])

    snap_file = mapped(manifest["files"]["snap"], manifest["snap_bytes"])
    late_file = mapped(manifest["files"]["late"], manifest["late_bytes"])
    sets = []
    for entry in manifest["sets"]:
        files = [view(mapped(slot["path"], slot["nbytes"]), dict(slot, offset=0)) for slot in entry["inputs"]]
        late = [view(late_file, s) for s in entry["late"]]
        on_device = device != "cpu"
        sets.append({"files": tuple(files), "late_files": late, "returned": None,
                     "inputs": tuple(_to_device(torch, t, device) for t in files) if on_device else tuple(files),
                     "late": [_poisoned_like(torch, t, device) for t in late] if on_device else late})
    calls = [{"set": c["set"], "snap": [view(snap_file, s) for s in c["snap"]]} for c in manifest["calls"]]
    return guard, torch, notes, sets, calls


def run(workdir, nonce):  # noqa: C901, PLR0915 - one straight sequence, commented step by step
    """Verify or time one candidate as ``WORKDIR/manifest.json`` says; write the report; exit."""
    sys.dont_write_bytecode = True  # -I ignores PYTHONDONTWRITEBYTECODE; the walls allow no writes
    with open(os.path.join(workdir, "manifest.json")) as handle:
        manifest = json.load(handle)
    out_fd = os.dup(1)
    guard, torch, notes, sets, calls = _setup(manifest)
    status_fd = os.open("/proc/self/status", os.O_RDONLY)
    limits, device = manifest["limits"], manifest["device"]
    walled = device == "cpu"
    notes.append(guard.limit_resources(limits["memory_bytes"] if walled else None, limits["cpu_seconds"],
                                       limits["file_bytes"]))
    notes.append(guard.restrict_filesystem(manifest["read_paths"]) if walled else
                 "files: not restricted (timing on a GPU: Triton's JIT writes its cache)")
    integrity = guard.Integrity(torch)

    # -- step 5: everything used below is bound here, before any candidate code exists -------------
    tb = torch._C.TensorBase
    dtype_of, device_of = tb.__dict__["dtype"].__get__, tb.__dict__["device"].__get__
    size_of, stride_of, numel_of, item_size, ptr_of = tb.size, tb.stride, tb.numel, tb.element_size, tb.data_ptr
    storage_of, storage_ptr, copy, is_float = tb.untyped_storage, torch._C.StorageBase.data_ptr, tb.copy_, \
        tb.is_floating_point
    full, nan, tensor_type = torch.full, float("nan"), torch.Tensor
    exact_type, len_, str_, tuple_, list_, zip_ = type, len, str, tuple, list, zip
    enumerate_, int_, float_, bool_, dict_, repr_, any_, callable_ = enumerate, int, float, bool, dict, repr, any, \
        callable
    perf_ns, sleep, pread, write, exit_now = time.perf_counter_ns, time.sleep, os.pread, os.write, os._exit
    gc_disable, gc_callbacks, changes = gc.disable, gc.callbacks, integrity.changes
    out_convention, timeout, entry_point = manifest["convention"] == "out", manifest["call_timeout_s"], \
        manifest["entry_point"]
    synchronize = torch.cuda.synchronize if not walled else (lambda: None)

    def os_threads():
        for line in pread(status_fd, 8192, 0).split(b"\n"):
            if line.startswith(b"Threads:"):
                return int_(line.split()[1])
        return -1

    def footprint(t):
        if numel_of(t) == 0:
            return (0, 0)
        extent = 1
        for size, step in zip_(size_of(t), stride_of(t)):
            extent += (size - 1) * step
        return (ptr_of(t), ptr_of(t) + extent * item_size(t))

    def describe(tensors, inputs):
        spans = [footprint(t) for t in tensors]
        in_storages = [storage_ptr(storage_of(t)) for t in inputs]
        found = []
        for index, t in enumerate_(tensors):
            storage = storage_ptr(storage_of(t))
            found.append({"dtype": str_(dtype_of(t))[6:], "shape": list_(size_of(t)), "stride": list_(stride_of(t)),
                          "device": str_(device_of(t)),
                          "aliases_inputs": [j for j, s in enumerate_(in_storages) if s == storage],
                          "overlaps_outputs": [j for j, (lo, hi) in enumerate_(spans) if j != index and
                                               lo < spans[index][1] and spans[index][0] < hi]})
        return found

    def to_json(value):
        kind = exact_type(value)
        if kind is dict_:
            return "{" + ", ".join(to_json(str_(k)) + ": " + to_json(v) for k, v in value.items()) + "}"
        if kind in (list_, tuple_):
            return "[" + ", ".join(to_json(v) for v in value) + "]"
        if kind is str_:
            return '"' + "".join(c if (c.isprintable() and c not in '"\\') else f"\\u{ord(c):04x}"
                                 for c in value) + '"'
        if kind is bool_ or value is None:
            return {True: "true", False: "false", None: "null"}[value]
        if kind in (int_, float_):
            return repr_(value) if value == value and value not in (float_("inf"), float_("-inf")) else "null"
        return to_json(repr_(kind))

    def finish(report):
        report["refused"] = list_(recorder.violations)
        data = (nonce + to_json(report) + nonce + "\n").encode()
        while data:
            data = data[write(out_fd, data):]
        exit_now(0)

    def settle(entry):
        """Step 7's first half; a reason to stop, or None."""
        gc_disable()
        if os_threads() > threads_before:
            return "the candidate left a thread running after it returned"
        if len_(gc_callbacks):
            return "the candidate installed a gc callback"
        changed = changes()
        return "tampering: " + "; ".join(changed[:8]) if changed else None

    gc_disable()  # gc callbacks and cyclic finalizers would run candidate code in this thread
    if walled:
        recorder = guard.install_audit_hook(_thread.get_ident(), manifest["read_paths"])
        notes.append("operations: audit hook on every thread but the harness's (in-process)")
    else:
        recorder = guard.AuditRecorder()
        notes.append("operations: no audit hook (timing on a GPU: Triton's JIT runs ptxas as a process)")
    runner_call = Runner().call
    threads_before = os_threads()
    report, keep_alive = {"notes": notes, "calls": [], "load_error": None, "stopped": None}, []

    # -- step 6: load and call -----------------------------------------------------------------------
    loaded = runner_call(_import_candidate, (manifest["candidate"],), {}, timeout)
    keep_alive.append(loaded)
    stop = "importing the candidate timed out" if loaded == "timeout" else settle({})
    if stop is None and not loaded[0]:
        report["load_error"] = loaded[2]
        finish(report)
    fn = None if stop else loaded[1].get(entry_point)
    if stop is None and not callable_(fn):
        report["load_error"] = f"the candidate defines no function {entry_point!r}"
        finish(report)
    for call in calls if stop is None else []:
        current = sets[call["set"]]
        if not out_convention:  # poison the allocator: a fresh torch.empty likely reuses these NaN blocks
            for slot in call["snap"]:
                full(tuple_(size_of(slot)), nan if is_float(slot) else 7, dtype=dtype_of(slot), device=device)
        kwargs = {"out": tuple_(current["late"])} if out_convention else {}
        start = perf_ns()
        result = runner_call(fn, current["inputs"], kwargs, timeout)
        if result != "timeout":
            synchronize()  # the whole device: work a candidate left on another stream is timed too
        elapsed = perf_ns() - start
        keep_alive.append(result)
        entry = {"set": call["set"], "ns": elapsed}
        report["calls"].append(entry)
        if result == "timeout":
            stop = f"a call did not return within {timeout} s"
            break
        stop = settle(entry)
        if stop:
            break
        ok, value, error = result
        if not ok:
            entry["error"] = error
            continue
        if out_convention:
            tensors = current["late"]
            if value is not None:
                entry["error"] = "an out= candidate must return None"
                continue
        else:
            value = (value,) if exact_type(value) is tensor_type else value
            if exact_type(value) not in (tuple_, list_) or any_(exact_type(v) is not tensor_type for v in value):
                entry["error"] = "returned something other than a tensor or a tuple/list of plain tensors"
                continue
            tensors = tuple_(value)
            current["returned"] = tensors
        entry["outputs"] = describe(tensors, current["inputs"])
        if len_(tensors) != len_(call["snap"]):
            entry["error"] = f"returned {len_(tensors)} outputs, the region has {len_(call['snap'])}"
            continue
        for slot, t in zip_(call["snap"], tensors):
            if size_of(t) == size_of(slot) and dtype_of(t) == dtype_of(slot) and str_(device_of(t)) == device:
                copy(slot, t)
    # -- step 8: late writes, report --------------------------------------------------------------------
    if stop is None:
        sleep(manifest["late_wait_s"])
        stop = settle({})
    if stop is None and not out_convention:
        for current in sets:
            for slot, t in zip_(current["late_files"], current["returned"] or ()):
                if size_of(t) == size_of(slot) and dtype_of(t) == dtype_of(slot) and str_(device_of(t)) == device:
                    copy(slot, t)
    if stop is None and not walled:  # device buffers back into the files the parent reads
        synchronize()
        for current in sets:
            for file_view, t in zip_(current["files"], current["inputs"]):
                copy(file_view, t)
            if out_convention:
                for file_view, t in zip_(current["late_files"], current["late"]):
                    copy(file_view, t)
    report["stopped"] = stop
    finish(report)


if __name__ == "__main__":
    run(sys.argv[1], sys.stdin.readline().strip())
