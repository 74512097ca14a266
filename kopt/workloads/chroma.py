"""Chroma1-HD: diffusers' ``ChromaTransformer2DModel`` with random weights.

Full size is the published 8.9B configuration (the class defaults: FLUX.1's 19 double-stream and
38 single-stream blocks, 3072 wide, with the per-block modulation replaced by one approximator MLP
of 5 layers, 5120 wide, over the timestep). Inputs follow ``ChromaPipeline`` at 1024x1024: 4096
packed latent tokens of 64 channels with (0, h, w) ids, 512 T5 tokens with zero ids, the attention
mask the pipeline builds (the prompt's tokens and its first padding token, then every image token;
in the latents' dtype), and ``timestep / 1000`` in the latents' dtype. No guidance input.
"""

from __future__ import annotations

from typing import Any

import torch

from kopt.workloads.base import Size, Workload
from kopt.workloads.flux1 import image_ids
from kopt.workloads.pipeline_inputs import draw_timestep, prompt_mask, randn, scheduler_timestep, text_length

FULL: dict[str, Any] = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                            num_attention_heads=24, joint_attention_dim=4096, axes_dims_rope=(16, 56, 56),
                            approximator_num_channels=64, approximator_hidden_dim=5120, approximator_layers=5)
TINY: dict[str, Any] = dict(FULL, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                            num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 6, 6),
                            approximator_num_channels=16, approximator_hidden_dim=32, approximator_layers=2)
# (packed latent grid height, width, T5 tokens)
SHAPES = {"full": (64, 64, 512), "tiny": (4, 4, 8)}


def build_model(size: Size) -> torch.nn.Module:
    from diffusers import ChromaTransformer2DModel

    return ChromaTransformer2DModel(**(FULL if size == "full" else TINY))


def attention_mask(text: int, valid: int, image: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(1, text + image): ``ChromaPipeline`` keeps the prompt tokens and the first padding token
    (``arange <= length``), then appends ones for the image tokens."""
    text_mask = prompt_mask(text, min(valid + 1, text), device, dtype)
    return torch.cat([text_mask, torch.ones(1, image, device=device, dtype=torch.bool)], dim=1)


def build_inputs(size: Size, device: torch.device, dtype: torch.dtype,
                 generator: torch.Generator, negative: bool) -> dict[str, Any]:
    config = FULL if size == "full" else TINY
    height, width, text = SHAPES[size]
    t = draw_timestep(generator)
    return dict(
        hidden_states=randn((1, height * width, config["in_channels"]), generator, device, dtype),
        encoder_hidden_states=randn((1, text, config["joint_attention_dim"]), generator, device, dtype),
        timestep=scheduler_timestep(t, device, torch.float32).to(dtype) / 1000,
        img_ids=image_ids(height, width).to(device=device, dtype=dtype),
        txt_ids=torch.zeros(text, 3, device=device, dtype=dtype),
        attention_mask=attention_mask(text, text_length(text, negative), height * width, device, dtype),
        return_dict=False,
    )


WORKLOAD = Workload(
    name="chroma",
    description="ChromaTransformer2DModel, Chroma1-HD config, random weights",
    build_model=build_model,
    build_inputs=build_inputs,
    step_invariant=("timestep", "img_ids", "txt_ids"),
)
