"""What a user gets from ``pip install kopt``: run by ``.ci/run`` with the wheel installed in a fresh
venv, from a folder outside the checkout (an editable install would hide a module missing from the
wheel). Imports kopt, runs the ``kopt`` command, and compiles a small model both ways (the
``torch.compile`` backend, resolved through its entry point before kopt is imported, and
``kopt.compile``), each checked against eager float32 on a fresh random input.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

BOUND = 1e-4  # float32 relative error: the passes' contracts allow more, a wrong rewrite gives ~1


class TwoHeads(torch.nn.Module):
    """Two linears reading one tensor (``sibling-merge`` concatenates them) after a GELU MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)
        self.q, self.k = torch.nn.Linear(32, 16), torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(torch.nn.functional.gelu(self.up(x)))
        return self.q(h) * self.k(h).sigmoid()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def check(label: str, compiled: object, model: torch.nn.Module, report_of: object) -> None:
    x = torch.randn(8, 32)
    with torch.no_grad():
        err = rel_err(compiled(x), model(x))
    report = report_of()
    graph = report.graphs[0]
    fired = sum(record.total_matches for record in graph.passes)
    print(f"{label}: rel_err {err:.2e}, {fired} rewrites, lowering {graph.lowering}, fallback {graph.fallback}")
    assert err < BOUND, f"{label}: relative error {err:.2e} against eager float32"
    assert fired > 0 and graph.fallback is None and graph.lowering == "inductor", report


def main() -> None:
    assert not Path("kopt").exists(), "run from a folder outside the checkout"
    torch.manual_seed(0)
    model = TwoHeads().eval()
    by_entry_point = torch.compile(model, backend="kopt")  # resolves "kopt" without importing it first
    import kopt

    check('torch.compile(backend="kopt")', by_entry_point, model, kopt.last_backend_report)
    torch._dynamo.reset()
    compiled = kopt.compile(model)
    check("kopt.compile", compiled, model, lambda: compiled.kopt_report)

    command = Path(sys.executable).with_name("kopt")
    usage = subprocess.run([str(command), "--help"], capture_output=True, text=True, check=True).stdout
    assert "explain" in usage and "demo" in usage, usage

    outside = [name for name, module in sys.modules.items() if name.split(".")[0] == "kopt"
               and not str(getattr(module, "__file__", None) or sys.prefix).startswith(sys.prefix)]
    assert not outside, f"modules imported from outside the venv {sys.prefix}: {outside}"
    print(f"the wheel's kopt {kopt.__version__} from {Path(kopt.__file__).parent}: import, CLI and compile OK")


if __name__ == "__main__":
    main()
