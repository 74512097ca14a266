"""The sandbox says what it enforced, and the kernel layers hold where the platform has them."""

from __future__ import annotations

import torch

from kopt.agent import region as regions
from kopt.agent.candidate import Candidate, CandidateKind, original_candidate
from kopt.agent.verify import VerifyConfig, verify
from kopt.passes.base import Contract

TOL = Contract.tolerance(1e-5)
QUICK = VerifyConfig(shape_trials=1)


def _region():
    return regions.from_function(lambda x: x * 3.0 + 1.0, torch.randn(8, 16))


def test_the_verdict_log_names_every_layer():
    """Network, files, resources and operations each get a line saying what enforced them."""
    region = _region()
    verdict = verify(region, original_candidate(region, TOL), QUICK)
    assert verdict.accepted, verdict.reason
    for layer in ("network:", "files:", "resources:", "operations:"):
        assert layer in verdict.log, layer


def test_c_level_file_reads_are_refused_by_the_kernel():
    """torch.from_file opens files in C++, unseen by a Python audit hook; Landlock refuses it anyway (where
    the kernel has Landlock; elsewhere the log says so and this test has nothing to check)."""
    region = _region()
    reader = Candidate(region.signature, CandidateKind.RULE_BY_EXAMPLE,
                       "import torch\n\n\ndef candidate(x):\n    torch.from_file('/etc/hostname', size=1, "
                       "dtype=torch.uint8)\n    return x * 3.0 + 1.0\n", TOL)
    verdict = verify(region, reader, QUICK)
    if "Landlock ABI" not in verdict.log:
        return
    assert not verdict.accepted and verdict.failed_names == {"runs"} and "Permission denied" in verdict.reason


def test_environment_is_scrubbed():
    """The child sees no API key or cache folder of the parent (they are not passed at all)."""
    import os

    region = _region()
    os.environ["ANTHROPIC_API_KEY"] = "sk-test-not-a-real-key"
    try:
        leak = Candidate(region.signature, CandidateKind.RULE_BY_EXAMPLE,
                         "import os\n\n\ndef candidate(x):\n    assert 'ANTHROPIC_API_KEY' not in os.environ\n"
                         "    assert 'KOPT_CACHE_DIR' not in os.environ\n    return x * 3.0 + 1.0\n", TOL)
        verdict = verify(region, leak, QUICK)
    finally:
        del os.environ["ANTHROPIC_API_KEY"]
    assert verdict.accepted, verdict.reason
