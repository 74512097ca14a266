"""Does the knowledge base pay on the GPU? Gain curves of two measured agent runs on one model.

    python -m benchmarks.agent_curves COLD.json WARM.json --out benchmarks/results/agent_kb_pays-gpu

COLD and WARM are ``benchmarks.agent_run`` results for the same workload: COLD with an empty
knowledge base, WARM with one another model filled (``--kb``), e.g.::

    python -m benchmarks.agent_run --workload qwen-image --fp8 --budget-min 6 --out cold
    python -m benchmarks.agent_run --workload ltx-video --fp8 --budget-min 6 --kb kb.sqlite --out first
    python -m benchmarks.agent_run --workload qwen-image --fp8 --budget-min 6 --kb kb.sqlite --out warm

A run's gain after k evaluations is 1 - 1 / (product of the median end-to-end speedups accepted
among its first k): each accepted candidate was measured on top of those accepted before it, so the
product is the model's speedup over where the run started. Writes ``<out>.json`` (both curves, the
final gains and the evaluations each needed to reach 80% of its own final gain; the goal: warm needs
at most half of cold's) and ``<out>.png``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    import sys

    sys.path.append(str(Path(__file__).resolve().parents[1]))

from benchmarks.agent_kb_pays import _plot, evaluations_to  # noqa: E402


def measured_curve(run: Mapping[str, Any]) -> list[float]:
    """The gain after each evaluation of an ``agent_run`` result (index 0: before any)."""
    speedup, curve = 1.0, [0.0]
    for evaluation in run["evaluations"]:
        if evaluation["status"] == "accepted":
            speedup *= evaluation["e2e"]["speedup"]["median"]
        curve.append(1.0 - 1.0 / speedup)
    return curve


def summary(run: Mapping[str, Any], source: str) -> dict[str, Any]:
    curve = measured_curve(run)
    seconds = [0.0]
    for evaluation in run["evaluations"]:
        seconds.append(seconds[-1] + (evaluation.get("seconds") or 0.0))
    return {"file": source, "workload": run["workload"], "finished": run.get("finished", True),
            "evaluations": len(run["evaluations"]),
            "final_gain": curve[-1], "evaluations_to_80pct": evaluations_to(curve) if curve[-1] > 0 else None,
            "gain_curve": curve, "seconds": seconds,
            "order": [f"{e['kind']} {e['params']} -> {e['status']}" for e in run["evaluations"]]}


def compare(cold: Path, warm: Path) -> dict[str, Any]:
    """Both curves, and whether the warm run reached 80% of its gain in at most half the evaluations."""
    runs = {name: json.loads(path.read_text()) for name, path in (("cold", cold), ("warm", warm))}
    if runs["cold"]["workload"] != runs["warm"]["workload"]:
        raise SystemExit(f"the runs are of two workloads ({runs['cold']['workload']}, {runs['warm']['workload']}): "
                         "the curves compare one model searched cold and warm")
    data = {name: summary(run, str(path)) for (name, run), path in zip(runs.items(), (cold, warm), strict=True)}
    cold_n, warm_n = data["cold"]["evaluations_to_80pct"], data["warm"]["evaluations_to_80pct"]
    data["workload"] = runs["cold"]["workload"]
    # a run killed before it finished records no clock; both runs of one comparison use the same one
    data["clock"] = runs["warm"].get("clock") or runs["cold"].get("clock", "clock not recorded")
    data["pays"] = None if cold_n is None or warm_n is None else warm_n <= cold_n / 2
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cold", type=Path)
    parser.add_argument("warm", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="path stem: writes <out>.json and <out>.png")
    args = parser.parse_args()
    data = compare(args.cold, args.warm)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    _plot(data, args.out.with_suffix(".png"), xlabel=f"evaluations on {data['workload']}",
          ylabel=f"model time saved (%, {data['clock']})",
          title=f"{data['workload']} searched cold vs with another model's knowledge base")
    for name in ("cold", "warm"):
        run = data[name]
        print(f"{name}: {run['evaluations']} evaluations, final gain {run['final_gain']:.1%}, "
              f"80% of it after {run['evaluations_to_80pct']}")
    print(f"the knowledge base pays (warm needs at most half of cold's evaluations): {data['pays']}")


if __name__ == "__main__":
    main()
