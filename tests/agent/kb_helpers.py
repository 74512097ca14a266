"""Small real regions and candidates for knowledge-base tests (shared with the concurrent writer)."""

from __future__ import annotations

import torch

from kopt.agent import region as regions
from kopt.agent.candidate import Candidate, CandidateKind
from kopt.agent.kb import Environment
from kopt.passes.base import Contract

GPU_ENV = Environment(gpu="NVIDIA H200", driver="570.86", cuda="12.8", torch="2.13.0", triton="3.9.0", kopt="0.1.0",
                      python="3.11.7", platform="Linux-x86_64")


def scaled_gelu_region(width: int = 32) -> regions.Region:
    return regions.from_function(lambda x, b: torch.nn.functional.gelu(x + b) * 2.0, torch.randn(8, width),
                                 torch.randn(width))


def candidate_for(region: regions.Region, variant: int = 0) -> Candidate:
    source = f"import torch\n\n\ndef candidate(b, x):\n    return torch.nn.functional.gelu(x + b) * 2.0  # v{variant}\n"
    return Candidate(region.signature, CandidateKind.RULE_BY_EXAMPLE, source, Contract.tolerance(1e-5),
                     why="the same ops", origin="test", params=(("variant", variant),))
