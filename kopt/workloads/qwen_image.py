"""Qwen-Image: diffusers' ``QwenImageTransformer2DModel`` with random weights.

Full size is the published 20.4B configuration; inputs follow ``QwenImagePipeline``: a 1024x1024
image is 128x128 VAE latents packed 2x2 into 4096 tokens of 64 channels, 256 text tokens of the
Qwen2.5-VL hidden size, a text mask, and ``timestep / 1000``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from kopt.workloads.base import Size, Workload, randn

FULL = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False,
            axes_dims_rope=(16, 56, 56))
TINY = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=32,
            num_attention_heads=2, joint_attention_dim=24, guidance_embeds=False,
            axes_dims_rope=(8, 12, 12))
# (latent patch grid height, width, text tokens); the negative prompt is shorter, as in practice.
SHAPES = {"full": (64, 64, 256), "tiny": (8, 8, 7)}


def build_model(size: Size) -> torch.nn.Module:
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel(**(FULL if size == "full" else TINY))


def build_inputs(size: Size, device: torch.device, dtype: torch.dtype,
                 generator: torch.Generator, negative: bool) -> dict[str, Any]:
    config = FULL if size == "full" else TINY
    height, width, text = SHAPES[size]
    channels = config["in_channels"]
    mask = torch.ones(1, text, dtype=torch.long, device=device)
    if negative:  # a shorter negative prompt, padded to the same length with a mask
        mask[:, text - text // 4:] = 0
    return dict(
        hidden_states=randn((1, height * width, channels), generator, device, dtype),
        encoder_hidden_states=randn((1, text, config["joint_attention_dim"]), generator, device, dtype),
        encoder_hidden_states_mask=mask,
        timestep=torch.full((1,), 0.5, device=device, dtype=dtype),
        img_shapes=[(1, height, width)],
        return_dict=False,
    )


def resized(inputs: Mapping[str, Any], height: int, width: int, text: int,
            generator: torch.Generator) -> dict[str, Any]:
    """The call for a ``height`` x ``width`` patch grid and ``text`` prompt tokens (full mask)."""
    image, prompt = inputs["hidden_states"], inputs["encoder_hidden_states"]
    return dict(inputs,
                hidden_states=randn((1, height * width, image.shape[-1]), generator, image.device, image.dtype),
                encoder_hidden_states=randn((1, text, prompt.shape[-1]), generator, prompt.device, prompt.dtype),
                encoder_hidden_states_mask=torch.ones(1, text, dtype=torch.long, device=prompt.device),
                img_shapes=[(1, height, width)])


WORKLOAD = Workload(
    name="qwen-image",
    description="QwenImageTransformer2DModel (diffusers), random weights",
    build_model=build_model,
    build_inputs=build_inputs,
    step_invariant=("timestep", "guidance", "img_shapes"),
    build_resized=resized,
)
