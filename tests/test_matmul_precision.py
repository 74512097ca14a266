"""kopt.matmul_precision: the reference runs without TF32 and leaves every precision setting as it found it.

Each case runs in a fresh process: torch remembers for the whole process whether the legacy and the
new precision settings were mixed, so one case's settings would change what the next may read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, torch
from kopt.matmul_precision import full_precision_matmuls, precision_settings
from kopt.reference import reference_forward
{setup}


def legacy_flags():  # what a user of the legacy flags reads (torch raises where the two APIs disagree)
    if not {reads_legacy}:
        return None
    return [torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision()]


legacy_before = legacy_flags()
before = precision_settings()
inside = {{}}

class Probe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        inside.update(precision_settings())
        return self.linear(x)

torch.manual_seed(0)
probe = Probe().to(torch.bfloat16)
out = reference_forward(probe, torch.randn(4, 16, dtype=torch.bfloat16))
after_reference = precision_settings()
try:
    with full_precision_matmuls():
        raise KeyError("raised inside")
except KeyError:
    pass
print(json.dumps(dict(before=before, inside=inside, after=after_reference, after_raise=precision_settings(),
                      dtype=str(out.dtype), legacy_before=legacy_before, legacy_after=legacy_flags())))
"""

# (the setting, whether its user reads the legacy flags: a user of the new settings may not)
CASES = {
    "torch's defaults": ("", True),
    "TF32 allowed through the new setting": ('torch.backends.cuda.matmul.fp32_precision = "tf32"', False),
    "TF32 allowed through the legacy call": ('torch.set_float32_matmul_precision("high")', True),
    "TF32 allowed through the legacy flags": ("torch.backends.cuda.matmul.allow_tf32 = True", True),
    "a child setting of its own": ('torch.backends.cudnn.conv.fp32_precision = "ieee"', False),
}


@pytest.mark.parametrize("setup, reads_legacy", CASES.values(), ids=CASES.keys())
def test_the_reference_runs_in_full_precision_and_restores_every_setting_exactly(setup, reads_legacy):
    """Inductor keys its FX graph cache by ``cuda.matmul.fp32_precision``: a setting left changed by the
    reference made every later graph of the process miss the cache a fresh process had filled. A user
    of the legacy flags reads the same values afterwards (torch raises where the two APIs disagree)."""
    script = SCRIPT.format(setup=setup, reads_legacy=reads_legacy)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["dtype"] == "torch.float64"  # the reference ran (on the CPU, in float64)
    assert seen["inside"]["cuda.matmul"] == "ieee" and seen["inside"]["cudnn.conv"] == "ieee"
    assert seen["after"] == seen["before"]
    assert seen["after_raise"] == seen["before"]
    assert "cuda.matmul" in seen["before"] and len(seen["before"]) >= 5
    assert seen["legacy_after"] == seen["legacy_before"] and (seen["legacy_before"] is not None) == reads_legacy
