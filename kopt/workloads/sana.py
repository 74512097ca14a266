"""Sana 1600M 1024px: diffusers' ``SanaTransformer2DModel`` with random weights.

Full size is the published Sana_1600M_1024px configuration (the class defaults: 20 blocks, linear
(ReLU) self-attention over 70 heads x 32 = 2240 channels, cross-attention to Gemma-2 text, Mix-FFN
with a depthwise convolution). Inputs follow ``SanaPipeline`` at 1024x1024: the DC-AE compresses
32x, so 32x32 latents of 32 channels are 1024 tokens (patch 1); 300 Gemma-2 tokens of 2304 channels
with the tokenizer's int64 mask; ``timestep = t * timestep_scale`` (1.0), float32 from the DPM
scheduler's integer ``t``. The pipeline batches the CFG halves into one call of batch 2.
"""

from __future__ import annotations

from typing import Any

import torch

from kopt.workloads.base import Size, Workload, unscaled
from kopt.workloads.pipeline_inputs import draw_timestep, prompt_mask, randn, scheduler_timestep, text_length

FULL: dict[str, Any] = dict(in_channels=32, out_channels=32, num_attention_heads=70, attention_head_dim=32,
                            num_layers=20, num_cross_attention_heads=20, cross_attention_head_dim=112,
                            cross_attention_dim=2240, caption_channels=2304, mlp_ratio=2.5, sample_size=32,
                            patch_size=1, norm_elementwise_affine=False, norm_eps=1e-6)
TINY: dict[str, Any] = dict(FULL, in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16,
                            num_layers=1, num_cross_attention_heads=2, cross_attention_head_dim=16,
                            cross_attention_dim=32, caption_channels=24, sample_size=4)
# (latent height, width, Gemma tokens)
SHAPES = {"full": (32, 32, 300), "tiny": (4, 4, 8)}


def build_model(size: Size) -> torch.nn.Module:
    from diffusers import SanaTransformer2DModel

    return SanaTransformer2DModel(**(FULL if size == "full" else TINY))


def build_inputs(size: Size, device: torch.device, dtype: torch.dtype,
                 generator: torch.Generator, negative: bool) -> dict[str, Any]:
    config = FULL if size == "full" else TINY
    height, width, text = SHAPES[size]
    t = draw_timestep(generator)
    return dict(
        hidden_states=randn((1, config["in_channels"], height, width), generator, device, dtype),
        encoder_hidden_states=randn((1, text, config["caption_channels"]), generator, device, dtype),
        encoder_attention_mask=prompt_mask(text, text_length(text, negative), device, torch.int64),
        timestep=scheduler_timestep(t, device, torch.int64) * 1.0,
        return_dict=False,
    )


WORKLOAD = Workload(
    name="sana",
    description="SanaTransformer2DModel, Sana 1600M 1024px config (linear attention), random weights",
    build_model=build_model,
    build_inputs=build_inputs,
    step_invariant=("timestep",),
    pipeline_timestep=unscaled,
)
