"""Lowering: hand a (rewritten) graph to Inductor, or run it as plain FX."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kopt.config import Lowering


def lower(graph_module: torch.fx.GraphModule, example_inputs: list[object],
          lowering: Lowering) -> Callable[..., object]:
    """A callable that runs ``graph_module`` on arguments shaped like ``example_inputs``."""
    if lowering is Lowering.EAGER:
        return graph_module
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(graph_module, example_inputs)
