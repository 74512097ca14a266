"""What the micro-benchmarks (``fp8_gemm.py``, ``attention.py``) share: their command line (``--tiny``
for the CPU smoke run, ``--out``), GPU time by CUDA-graph replay, and their JSON + markdown output
headed by the run's device, torch version and commit."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch


def parse_args(description: str) -> tuple[torch.device, Path, bool]:
    """(device, output folder, tiny): the GPU unless ``--tiny`` or there is none."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run on one small shape")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    return device, args.out, args.tiny


def replay_ms(fn: Callable[[], Any], device: torch.device) -> float:
    """GPU time of one call, the median of CUDA-graph replays (no host launch cost); on the CPU the
    wall time of one call (a smoke figure)."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median"))


def cell(value: float | None, spec: str) -> str:
    """A table cell: "–" where nothing was measured, else ``value`` in the format ``spec``."""
    return "–" if value is None else format(value, spec)


def timed_row(label: dict[str, Any], kernel: str, config: str, fn: Callable[[], Any], exact: Any, flops: int,
              device: torch.device) -> dict[str, Any]:
    """One kernel row: ``fn``'s GPU time (:func:`replay_ms`), its TFLOP/s for ``flops``, and its relative
    error against ``exact`` (None: not the same computation, no error to give); printed as it is taken. A
    launch config that fails (does not compile, runs out of resources) gives a row with its ``error``
    and no numbers, so the other configs are still timed."""
    try:
        out = fn()
        ms = replay_ms(fn, device)
    except Exception as failure:  # noqa: BLE001 - reported in the row, the rest of the table goes on
        reason = (str(failure).splitlines() or [type(failure).__name__])[0][:160]
        print(f"{label['model']:<10} {kernel:<22} {config:<50} failed: {reason}", flush=True)
        return dict(label, kernel=kernel, config=config, ms=None, tflops=None, rel_err=None, error=reason)
    error = None if exact is None else ((out.double() - exact.double()).norm() / exact.double().norm()).item()
    row = dict(label, kernel=kernel, config=config, ms=ms, tflops=flops / (ms * 1e-3) / 1e12, rel_err=error)
    print(f"{row['model']:<10} {kernel:<22} {config:<50} {ms:8.4f} ms {row['tflops']:7.1f} TFLOP/s "
          f"rel {cell(error, '.2e')}", flush=True)
    return row


KERNEL_HEADER = ("| model | shape | kernel | config | ms | TFLOP/s | rel err |", "|---|---|---|---|---:|---:|---:|")


def kernel_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The rows of :func:`timed_row` under :data:`KERNEL_HEADER`; a failed config's reason stands in its
    time cell, so the row keeps the table's columns."""
    return [f"| {r['model']} | {r['shape']} | {r['kernel']} | {r['config']} | "
            + (f"failed: {r['error'].replace('|', '/')}" if r.get("error") else cell(r["ms"], ".4f"))
            + f" | {cell(r['tflops'], '.0f')} | {cell(r['rel_err'], '.2e')} |" for r in rows]


def write(out_dir: Path, stem: str, title: str, intro: str, header: Sequence[str], table: Sequence[str],
          rows: list[dict[str, Any]], device: torch.device) -> str:
    """``<stem>.json`` (meta + rows) and ``<stem>.md`` (title, intro, the table); returns the markdown."""
    meta = dict(device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                torch=torch.__version__, commit=os.environ.get("KOPT_COMMIT"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    lines = [f"# {title} on {meta['device']} (torch {meta['torch']}, commit {meta['commit']})", "", intro, "",
             *header, *table]
    text = "\n".join(lines) + "\n"
    (out_dir / f"{stem}.md").write_text(text)
    return text
