"""What a workload is: a model factory plus the inputs a real serving loop feeds it.

Every benchmark, test and CLI command builds models through this one interface, so the shapes and
input conventions (timestep scaling, rope ids, masks) live in exactly one place per model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch

Size = Literal["tiny", "full"]


def per_thousand(t: torch.Tensor) -> torch.Tensor:
    """``t / 1000``: the timestep most flow-matching pipelines pass (FLUX, Qwen-Image, Chroma)."""
    return t / 1000


def unscaled(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself: pipelines whose model embeds the raw scheduler timestep."""
    return t


@dataclasses.dataclass(frozen=True)
class Workload:
    """A named model with realistic example inputs.

    Attributes:
        name: registry name (``qwen-image``, ``flux2`` or ``module:factory``).
        description: one line for reports.
        build_model: ``(size) -> nn.Module`` with random weights, on the current default device and dtype.
        build_inputs: ``(size, device, dtype, generator, negative) -> kwargs`` for one forward call;
            ``negative=True`` gives the unconditional (negative-prompt) half of a CFG pair.
        step_invariant: names of inputs that stay the same across both calls of a CFG pair.
        timestep_arg: the input that the pipeline rebuilds for every call (None: no timestep, e.g. an LLM).
        pipeline_timestep: what the pipeline passes as ``timestep_arg`` for a scheduler timestep
            ``t`` in [0, 1000] (already a tensor of the input's dtype): ``t / 1000`` for most flow-matching
            pipelines, ``t`` itself for those whose model scales it (Wan, SD3, CogVideoX, ...).
        build_resized: ``(inputs, height, width, text, generator) -> kwargs``: the same call for
            another latent grid and prompt length (other resolutions; dynamic shapes), or None.
    """

    name: str
    description: str
    build_model: Callable[[Size], torch.nn.Module]
    build_inputs: Callable[[Size, torch.device, torch.dtype, torch.Generator, bool], dict[str, Any]]
    step_invariant: tuple[str, ...] = ("timestep", "guidance")
    timestep_arg: str | None = "timestep"
    pipeline_timestep: Callable[[torch.Tensor], torch.Tensor] = per_thousand
    build_resized: Callable[[Mapping[str, Any], int, int, int, torch.Generator], dict[str, Any]] | None = None

    def model(self, size: Size = "tiny", *, device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.float32) -> torch.nn.Module:
        """Build the model directly on ``device`` in ``dtype`` (no full-precision CPU copy first)."""
        if size not in ("tiny", "full"):
            raise ValueError(f"size must be 'tiny' or 'full', got {size!r}")
        if size == "full" and torch.device(device).type == "cpu":
            raise ValueError(f"{self.name} at full size has tens of billions of parameters: build it on a GPU "
                             "(device='cuda') or on device='meta' to inspect its graph without memory")
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                module = self.build_model(size)
        finally:
            torch.set_default_dtype(previous)
        return module.eval().requires_grad_(False)

    def inputs(self, size: Size = "tiny", *, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, seed: int = 0,
               negative: bool = False) -> dict[str, Any]:
        """Fresh random inputs for one call; ``seed`` makes them reproducible."""
        generator = torch.Generator(device="cpu").manual_seed(seed)
        return self.build_inputs(size, torch.device(device), dtype, generator, negative)

    def resized(self, inputs: Mapping[str, Any], *, height: int, width: int, text: int,
                seed: int = 0) -> dict[str, Any]:
        """``inputs`` for a ``height`` x ``width`` latent grid (in patches: ``height * width`` image
        tokens) and ``text`` prompt tokens, with fresh random activations from ``seed``."""
        if self.build_resized is None:
            raise NotImplementedError(f"workload {self.name!r} does not say how to build inputs of other sizes")
        return self.build_resized(inputs, height, width, text, torch.Generator(device="cpu").manual_seed(seed))

    def at_step(self, inputs: Mapping[str, Any], step: int) -> dict[str, Any]:
        """``inputs`` at denoising step ``step``: the timestep scaled by 1, 0.99, ... 0.51 (then
        again), 50 values 1 % apart that stay distinct even in bf16, so that timing repeated calls
        never measures a cache of step-invariant work instead of a step."""
        kwargs = dict(inputs)
        if self.timestep_arg is not None and self.timestep_arg in kwargs:
            timestep = kwargs[self.timestep_arg]
            scaled = timestep * step_factor(step)
            # integer timesteps (DDIM, DPM-Solver schedulers) stay integers
            kwargs[self.timestep_arg] = scaled if timestep.is_floating_point() else scaled.round().to(timestep.dtype)
        return kwargs

    def cfg_pair(self, module: Callable[..., Any], cond: Mapping[str, Any],
                 uncond: Mapping[str, Any], t: float = 500.0) -> tuple[Any, Any]:
        """Run the classifier-free-guidance pair as the diffusers pipelines do.

        Two calls with the same timestep *value*, each with a timestep tensor built anew
        (``pipeline_timestep(t.expand(batch))``, e.g. ``t / 1000``), so that anything keyed on tensor
        identity would miss.
        """
        outputs = []
        for kwargs in (cond, uncond):
            kwargs = dict(kwargs)
            if self.timestep_arg is not None and self.timestep_arg in kwargs:
                reference = kwargs[self.timestep_arg]
                step = torch.tensor(t, device=reference.device, dtype=reference.dtype)
                kwargs[self.timestep_arg] = self.pipeline_timestep(step.expand(reference.shape[0]))
            outputs.append(module(**kwargs))
        return outputs[0], outputs[1]


def step_factor(step: int) -> float:
    """1, 0.99, ..., 0.51, then again (see :meth:`Workload.at_step`)."""
    return 1.0 - 0.01 * (step % 50)


def randn(shape: tuple[int, ...], generator: torch.Generator, device: torch.device,
          dtype: torch.dtype) -> torch.Tensor:
    """Normal samples drawn on the CPU (reproducible on any device), then moved."""
    return torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
