"""Pieces the diffusers pipelines build their transformer inputs from, shared by the zoo workloads.

A pipeline draws its latents and text embeddings from its encoders, which kopt does not run: the
workloads draw them at random (seeded), in the shapes and dtypes the pipeline gives them. What the
pipeline computes itself (timestep scaling, position ids, masks, guidance) follows its code.
"""

from __future__ import annotations

import torch

from kopt.workloads.base import randn

__all__ = ["draw_timestep", "prompt_mask", "randn", "scheduler_timestep", "text_length"]


def draw_timestep(generator: torch.Generator) -> float:
    """A scheduler timestep t in [100, 1000): the value a denoising step at noise level t/1000 sees."""
    return 100.0 + 900.0 * torch.rand((), generator=generator).item()


def scheduler_timestep(t: float, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``t.expand(batch)`` at batch 1, as the pipelines build it: one element of the scheduler's
    timesteps (a 0-d tensor of ``dtype``) expanded, so a zero-stride view. Integer schedulers (DDIM,
    DPM-Solver) hold int64 timesteps, so an integer dtype rounds."""
    value = round(t) if not dtype.is_floating_point else t
    return torch.tensor(value, device=device, dtype=dtype).expand(1)


def text_length(length: int, negative: bool) -> int:
    """Tokens of a prompt padded to ``length``: a long prompt, or a shorter negative prompt."""
    return max(1, length // 3) if negative else max(1, (3 * length) // 4)


def prompt_mask(length: int, valid: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(1, length) tokenizer attention mask: ones for the ``valid`` prompt tokens, zeros for padding."""
    mask = torch.zeros(1, length, device=device, dtype=dtype)
    mask[:, :valid] = 1
    return mask
