"""Lumina-Image 2.0: diffusers' ``Lumina2Transformer2DModel`` with random weights.

Full size is the published 2.6B configuration (26 joint blocks plus 2 context and 2 noise refiner
blocks, 2304 wide, 24 query / 8 key-value heads, 3-axis RoPE, Gemma-2 text of 2304 channels).
Inputs follow ``Lumina2Pipeline`` at 1024x1024: 128x128 latents of 16 channels (patched 2x2 into
4096 tokens inside the model), 256 Gemma-2 tokens with the tokenizer's int64 mask (the model keeps
only the unpadded caption tokens: it reads the mask's sum on the host, a graph break), and
``timestep = 1 - t / 1000`` (float32).
"""

from __future__ import annotations

from typing import Any

import torch

from kopt.workloads.base import Size, Workload
from kopt.workloads.pipeline_inputs import draw_timestep, prompt_mask, randn, scheduler_timestep, text_length

FULL: dict[str, Any] = dict(sample_size=128, patch_size=2, in_channels=16, hidden_size=2304, num_layers=26,
                            num_refiner_layers=2, num_attention_heads=24, num_kv_heads=8, multiple_of=256,
                            ffn_dim_multiplier=None, norm_eps=1e-5, scaling_factor=1.0, axes_dim_rope=(32, 32, 32),
                            axes_lens=(300, 512, 512), cap_feat_dim=2304)
TINY: dict[str, Any] = dict(FULL, sample_size=8, in_channels=4, hidden_size=32, num_layers=1, num_refiner_layers=1,
                            num_attention_heads=2, num_kv_heads=1, multiple_of=16, axes_dim_rope=(4, 6, 6),
                            axes_lens=(32, 16, 16), cap_feat_dim=24)
# (latent height, width, Gemma tokens)
SHAPES = {"full": (128, 128, 256), "tiny": (8, 8, 8)}


def build_model(size: Size) -> torch.nn.Module:
    from diffusers import Lumina2Transformer2DModel

    return Lumina2Transformer2DModel(**(FULL if size == "full" else TINY))


def one_minus_per_thousand(t: torch.Tensor) -> torch.Tensor:
    """``1 - t / 1000``: Lumina2Pipeline's timestep (1 is clean, 0 is noise)."""
    return 1 - t / 1000


def build_inputs(size: Size, device: torch.device, dtype: torch.dtype,
                 generator: torch.Generator, negative: bool) -> dict[str, Any]:
    config = FULL if size == "full" else TINY
    height, width, text = SHAPES[size]
    t = draw_timestep(generator)
    return dict(
        hidden_states=randn((1, config["in_channels"], height, width), generator, device, dtype),
        timestep=one_minus_per_thousand(scheduler_timestep(t, device, torch.float32)),
        encoder_hidden_states=randn((1, text, config["cap_feat_dim"]), generator, device, dtype),
        encoder_attention_mask=prompt_mask(text, text_length(text, negative), device, torch.int64),
        return_dict=False,
    )


WORKLOAD = Workload(
    name="lumina2",
    description="Lumina2Transformer2DModel, Lumina-Image-2.0 config, random weights",
    build_model=build_model,
    build_inputs=build_inputs,
    step_invariant=("timestep",),
    pipeline_timestep=one_minus_per_thousand,
)
