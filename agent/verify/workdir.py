"""The files the parent and the child share: inputs, output slots, the candidate, the manifest.

Inputs live in files the child maps shared, one file per input (so "shares storage with input j"
is a storage identity). After the child exits, the parent maps them again and compares every byte
with its own pristine copy: a candidate that wrote into an input cannot hide it, because the
evidence is in the parent's file, not in the child's report.

Output slots are pre-filled with NaN (integers with -7, booleans with True): a candidate that
leaves part of an output unwritten leaves poison there. ``snap`` holds each call's outputs as they
were when the call returned; ``late`` holds them again at the end of the run (for ``out=``
candidates ``late`` *is* the buffer they write), so a write after the return shows as a difference.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import torch

from kopt.agent.candidate import Candidate
from kopt.agent.verify.config import VerifyConfig

_ALIGN = 64
CHILD = Path(__file__).with_name("child.py")
GUARD = Path(__file__).with_name("guard.py")


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...]


def _span(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))


def _map(path: Path, nbytes: int) -> torch.Tensor:
    return torch.from_file(str(path), shared=True, size=max(nbytes, 1), dtype=torch.uint8)


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    storage = tensor.untyped_storage()
    raw = torch.empty(storage.nbytes(), dtype=torch.uint8)
    if storage.nbytes():
        raw.untyped_storage().copy_(storage)
    return raw


def _poison(tensor: torch.Tensor) -> None:
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.fill_(float("nan"))
    else:
        tensor.fill_(True if tensor.dtype is torch.bool else -7)


def preimports(candidate: Candidate) -> list[str]:
    """Modules the child imports before it records the integrity baseline: what the candidate's kind
    imports anyway and which changes torch as it loads, so that loading it is not taken for
    tampering. A Triton kernel needs Triton; the region as ``torch.compile`` lowers it
    (``lowered`` in its params) needs Dynamo, which wraps ``torch.manual_seed`` when imported, and
    Inductor, which generates Triton (the child then sets Inductor to compile in the calling thread:
    a compile worker pool's threads would outlive the call, which the child refuses)."""
    if candidate.kind.value == "triton-kernel":
        return ["numpy", "triton", "triton.language"]
    if dict(candidate.params).get("lowered"):
        return ["numpy", "torch._dynamo", "torch._inductor.compile_fx", "triton", "triton.language"]
    return []


class WorkDir:
    """Builds a child's work folder; reads back what it wrote. One instance per child run."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        (self.root / "candidate").mkdir()
        (self.root / "home").mkdir()
        self.inputs: list[list[torch.Tensor]] = []  # the parent's own tensors (never mapped by the child)
        self.raw_inputs: list[list[torch.Tensor]] = []  # their bytes, to compare the files with afterwards
        self.output_specs: list[list[OutputSpec]] = []
        self.input_slots: list[list[dict]] = []
        self.late_slots: list[list[dict]] = []
        self.calls: list[tuple[int, list[dict]]] = []
        self.snap_bytes = self.late_bytes = 0

    def _slot(self, spec: OutputSpec, which: str) -> dict:
        nbytes = _span(spec.shape, spec.stride) * torch.empty((), dtype=spec.dtype).element_size()
        offset = self.snap_bytes if which == "snap" else self.late_bytes
        padded = offset + (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        if which == "snap":
            self.snap_bytes = padded
        else:
            self.late_bytes = padded
        return {"offset": offset, "nbytes": nbytes, "shape": list(spec.shape), "stride": list(spec.stride),
                "dtype": str(spec.dtype).removeprefix("torch.")}

    def add_set(self, inputs: list[torch.Tensor], outputs: list[OutputSpec]) -> int:
        """Write one input set to files and reserve its late output slots; returns its index."""
        index = len(self.inputs)
        slots = []
        for position, tensor in enumerate(inputs):
            path = self.root / f"in{index}_{position}.bin"
            storage = tensor.untyped_storage()
            path.write_bytes(b"\0" * max(storage.nbytes(), 1))
            if storage.nbytes():
                _map(path, storage.nbytes()).untyped_storage().copy_(storage)
            slots.append({"path": str(path), "nbytes": storage.nbytes(), "shape": list(tensor.shape),
                          "stride": list(tensor.stride()), "dtype": str(tensor.dtype).removeprefix("torch.")})
        self.inputs.append(list(inputs))
        self.raw_inputs.append([_raw(t) for t in inputs])
        self.input_slots.append(slots)
        self.late_slots.append([self._slot(spec, "late") for spec in outputs])
        self.output_specs.append(list(outputs))
        return index

    def add_call(self, set_index: int) -> int:
        """A call on input set ``set_index`` whose outputs get their own snapshot slots."""
        self.calls.append((set_index, [self._slot(spec, "snap") for spec in self.output_specs[set_index]]))
        return len(self.calls) - 1

    def _view(self, storage: torch.Tensor, slot: dict) -> torch.Tensor:
        flat = storage[slot["offset"]: slot["offset"] + slot["nbytes"]].view(getattr(torch, slot["dtype"]))
        return flat.as_strided(slot["shape"], slot["stride"])

    def write(self, candidate: Candidate, config: VerifyConfig, read_paths: list[str], device: str = "cpu") -> None:
        """The candidate file, the poisoned output files and the manifest (``device``: where the child
        runs the calls; the files stay on the host either way)."""
        source_path = self.root / "candidate" / "candidate.py"
        source_path.write_text(candidate.source)
        for name, nbytes in (("snap", self.snap_bytes), ("late", self.late_bytes)):
            (self.root / f"{name}.bin").write_bytes(b"\0" * max(nbytes, 1))
        snap, late = self.mapped("snap"), self.mapped("late")
        for _, slots in self.calls:
            for slot in slots:
                _poison(self._view(snap, slot))
        for slots in self.late_slots:
            for slot in slots:
                _poison(self._view(late, slot))
        manifest = {
            "guard": str(GUARD), "candidate": str(source_path), "entry_point": candidate.entry_point,
            "convention": candidate.convention.value, "device": device, "threads": config.threads,
            "preimport": preimports(candidate),
            "limits": {"memory_bytes": config.memory_mb << 20, "cpu_seconds": config.cpu_seconds,
                       "file_bytes": 8 << 20},
            "read_paths": read_paths + [str(source_path.parent)], "call_timeout_s": config.call_timeout_s,
            "late_wait_s": config.late_wait_s,
            "files": {"snap": str(self.root / "snap.bin"), "late": str(self.root / "late.bin")},
            "snap_bytes": self.snap_bytes, "late_bytes": self.late_bytes,
            "sets": [{"inputs": i, "late": s} for i, s in zip(self.input_slots, self.late_slots, strict=True)],
            "calls": [{"set": s, "snap": slots} for s, slots in self.calls],
        }
        (self.root / "manifest.json").write_text(json.dumps(manifest))

    def mapped(self, name: str) -> torch.Tensor:
        nbytes = self.snap_bytes if name == "snap" else self.late_bytes
        return _map(self.root / f"{name}.bin", nbytes)

    def snapshot(self, call: int) -> list[torch.Tensor]:
        """What call ``call`` returned (as copied when it returned), detached from the file."""
        snap = self.mapped("snap")
        return [self._view(snap, slot).clone() for slot in self.calls[call][1]]

    def late(self, set_index: int) -> list[torch.Tensor]:
        late = self.mapped("late")
        return [self._view(late, slot).clone() for slot in self.late_slots[set_index]]

    def mutated_inputs(self, set_index: int) -> list[int]:
        """Positions of inputs whose file bytes differ from the parent's pristine copy."""
        changed = []
        for position, (slot, before) in enumerate(zip(self.input_slots[set_index], self.raw_inputs[set_index],
                                                      strict=True)):
            now = _map(Path(slot["path"]), slot["nbytes"])[: slot["nbytes"]]
            if not torch.equal(now, before):
                changed.append(position)
        return changed


def python_read_paths() -> list[str]:
    """What the child may read: the interpreter's prefixes and every import path (the standard
    library, site-packages); nothing of kopt, the work folder or the home directory."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths |= {p for p in sys.path if p and os.path.isdir(p) and ("site-packages" in p or p.startswith(sys.base_prefix))}
    return sorted(p for p in paths if p and os.path.exists(p))
