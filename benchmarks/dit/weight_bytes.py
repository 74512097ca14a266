#!/usr/bin/env python3
"""Weight bytes kopt holds after compiling, with and without ``share_weights``, on the CPU.

    python benchmarks/dit/weight_bytes.py                          # flux1, qwen-image, flux2, wan
    python benchmarks/dit/weight_bytes.py --models flux1 --dtype fp32

For each tiny workload: the bytes of the distinct storages behind the module's parameters and
buffers and kopt's derived tensors (merged, folded, quantized weights) after the first call,
divided by the module's own before compiling, and the bytes the weight checksum reads per call.
It counts storages, not a memory allocator's peak, so it isolates what kopt keeps beside the
module (activations and workspaces are the GPU harness's ``peak_gb``). Results:
``<out>/weight-bytes-cpu.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import kopt  # noqa: E402
from kopt.workloads import get_workload  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t.device.type != "meta"}
    return sum(seen.values())


def measure(name: str, dtype: torch.dtype, share: bool) -> dict[str, object]:
    workload = get_workload(name)
    torch.manual_seed(0)
    model = workload.model("tiny", dtype=dtype).eval()
    inputs = workload.inputs("tiny", seed=1, dtype=dtype)
    before = storage_bytes([*model.parameters(), *model.buffers()])
    compiled = kopt.compile(model, lower="eager", share_weights=share)
    with torch.no_grad():
        compiled(**inputs)
    graphs = compiled._kopt_backend.compiled
    derived = [t for g in graphs if g.binding is not None for _, t in g.binding.derived]
    after = storage_bytes([*model.parameters(), *model.buffers(), *derived])  # read again: shared ones moved
    watched = sum(g.report.weights.get("watched_bytes", 0) for g in graphs)
    return dict(model=name, share_weights=share, module_bytes=before, held_bytes=after, ratio=after / before,
                checksum_bytes_per_call=watched)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="flux1,qwen-image,flux2,wan")
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    rows = [measure(name, DTYPES[args.dtype], share) for name in args.models.split(",") for share in (False, True)]
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / "weight-bytes-cpu"
    stem.with_suffix(".json").write_text(json.dumps(dict(dtype=args.dtype, rows=rows), indent=1) + "\n")
    lines = [f"# Weight bytes held after compiling (tiny workloads, {args.dtype}, CPU)\n",
             "`python benchmarks/dit/weight_bytes.py`: distinct storages of the module's weights and kopt's "
             "derived tensors, relative to the module's own before compiling.\n",
             "| model | share_weights | module MiB | held MiB | held / module | checksum MiB per call |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['share_weights']} | {r['module_bytes'] / 2**20:.3f} | "
                     f"{r['held_bytes'] / 2**20:.3f} | {r['ratio']:.2f} | {r['checksum_bytes_per_call'] / 2**20:.3f} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
