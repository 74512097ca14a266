"""Merge autotune caches written by GPU benchmark runs into the choices kopt ships (kopt/kernels/tuned/).

    python benchmarks/tools/ship_autotune.py benchmarks/results/*.autotune.json

One file per GPU model (``kopt/kernels/tuned/<gpu>.json``, e.g. ``nvidia-h200.json``), in the tuner's own
format; later inputs win for a key measured twice. Only entries whose config holds integers are
kept (the tuner's own validity rule). See :mod:`kopt.kernels._autotune` for how they are used.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("caches", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=REPO / "kopt" / "kernels" / "tuned")
    args = parser.parse_args(argv)
    by_gpu: dict[str, dict[str, dict]] = {}
    for cache in args.caches:
        for key, entry in json.loads(cache.read_text())["entries"].items():
            config = entry.get("config", {})
            if not all(type(v) is int for v in config.values()):
                continue
            gpu = key.split("|")[2]
            by_gpu.setdefault(gpu, {})[key] = {"config": config, "timings_ms": entry.get("timings_ms", {})}
    args.out.mkdir(parents=True, exist_ok=True)
    for gpu, entries in by_gpu.items():
        name = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
        path = args.out / f"{name}.json"
        old = json.loads(path.read_text())["entries"] if path.exists() else {}
        path.write_text(json.dumps({"format": 1, "entries": {**old, **entries}}, indent=1, sort_keys=True) + "\n")
        print(f"{path}: {len({**old, **entries})} entries")


if __name__ == "__main__":
    main()
