"""Does the knowledge base pay? Model B searched cold, and again after model A filled the same KB.

    python -m benchmarks.agent_kb_pays [--out benchmarks/results]

Two configurations of one family (:func:`tests.agent.tiny_models.tiny_attention_block`: A at width 32,
sequence 24; B at width 48, sequence 40) share every region class and every pass decision, at other
shapes, so nothing A accepted applies to B as is (signatures differ); what transfers is the order of
the search (:mod:`kopt.agent.propose.warm`). Speed is the deterministic cost model's
(:mod:`kopt.agent.cost_model`, CPU), so the curves are reproducible.

For each run of B: the gain after each evaluation (1 − model time with what was accepted so far /
model time at the start), the final gain, and the evaluations needed to reach 80% of it. Writes
``agent_kb_pays.json`` and ``agent_kb_pays.png`` (both curves) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on the CPU

MODEL_A = {"width": 32, "seq": 24}
MODEL_B = {"width": 48, "seq": 40}


def gain_curve(result: Any) -> list[float]:
    """The model's gain under the run's cost model after each evaluation (index 0: before any)."""
    model, clock = result.clock.model, result.clock
    chosen = dict(result.resumed)

    def seconds() -> float:
        return model.model_s(result.graphs, result.occurrences, chosen, clock.rewritten(chosen))

    start = seconds()
    curve = [0.0]
    for evaluation in result.evaluations:
        if evaluation.status.value == "accepted":
            chosen[evaluation.candidate.region_signature] = evaluation.candidate
        curve.append(1.0 - seconds() / start)
    return curve


def evaluations_to(curve: list[float], fraction: float = 0.8) -> int:
    """The first evaluation count whose gain reaches ``fraction`` of the final gain."""
    target = fraction * curve[-1]
    return next(i for i, gain in enumerate(curve) if gain >= target - 1e-12)


def run(out: Path, *, seed: int = 0) -> dict:
    """Both runs of B; writes the JSON and the PNG under ``out``; returns the JSON's content."""
    from kopt.agent.loop import optimize
    from tests.agent.tiny_models import tiny_attention_block

    def search(config: dict, kb: Path, name: str) -> Any:
        model, inputs = tiny_attention_block(config["width"], config["seq"], seed=seed)
        return optimize(model, inputs, budget_min=30, kb_path=kb, clock="cost-model", seed=seed, model_name=name,
                        progress=False)

    with tempfile.TemporaryDirectory(prefix="kopt-kb-pays-") as folder:
        cold = search(MODEL_B, Path(folder) / "cold.sqlite", "block-B")
        search(MODEL_A, Path(folder) / "warm.sqlite", "block-A")
        warm = search(MODEL_B, Path(folder) / "warm.sqlite", "block-B")
    from benchmarks.agent_run import evaluation_records

    out.mkdir(parents=True, exist_ok=True)
    runs = {}
    for name, result in (("cold", cold), ("warm", warm)):  # also as agent_run writes a run (agent_curves reads it)
        (out / f"agent_kb_pays-{name}-run.json").write_text(json.dumps(
            {"workload": "block-B", "clock": result.clock.name, "evaluations": evaluation_records(result)}, indent=1))
        curve = gain_curve(result)
        runs[name] = {"evaluations": len(result.evaluations), "final_gain": curve[-1],
                      "evaluations_to_80pct": evaluations_to(curve), "gain_curve": curve,
                      "order": [f"{e.candidate.kind.value} {dict(e.candidate.params)} -> {e.status.value}"
                                for e in result.evaluations]}
    data = {"clock": "cost-model", "model_a": MODEL_A, "model_b": MODEL_B, "seed": seed, **runs}
    out.mkdir(parents=True, exist_ok=True)
    (out / "agent_kb_pays.json").write_text(json.dumps(data, indent=1))
    _plot(data, out / "agent_kb_pays.png")
    return data


def _plot(data: dict, path: Path, *, xlabel: str = "evaluations on model B",
          ylabel: str = "model time saved (%, cost model)",
          title: str = "model B searched cold vs after model A (same knowledge base)") -> None:
    """Both runs' gain curves (``data["cold"]``, ``data["warm"]``) as a PNG."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, style in (("cold", "-o"), ("warm", "-s")):
        curve = data[name]["gain_curve"]
        ax.plot(range(len(curve)), [100 * g for g in curve], style, markersize=3,
                label=f"{name}: 80% of final gain after {data[name]['evaluations_to_80pct']} evaluations")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    data = run(Path(args.out), seed=args.seed)
    for name in ("cold", "warm"):
        print(f"{name}: {data[name]['evaluations']} evaluations, final gain {data[name]['final_gain']:.1%}, "
              f"80% of it after {data[name]['evaluations_to_80pct']}")


if __name__ == "__main__":
    main()
