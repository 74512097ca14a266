"""PixArt-Sigma XL 1024: diffusers' ``PixArtTransformer2DModel`` with random weights.

Full size is the published PixArt-Sigma-XL-2-1024-MS configuration (0.6B: 28 blocks, 16 heads x 72
= 1152 wide, adaLN-single, cross-attention to T5, learned sigma: 8 output channels). Inputs follow
``PixArtSigmaPipeline`` at 1024x1024: 128x128 latents of 4 channels (patched 2x2 into 4096 tokens
inside the model, sin-cos positions at interpolation scale 2), 300 T5 tokens of 4096 channels with
the tokenizer's int64 mask, the integer timestep of its DPM scheduler (int64), and
``added_cond_kwargs`` without resolution or aspect-ratio conditions (Sigma has none). The
pipeline batches the CFG halves into one call of batch 2.
"""

from __future__ import annotations

from typing import Any

import torch

from kopt.workloads.base import Size, Workload, unscaled
from kopt.workloads.pipeline_inputs import draw_timestep, prompt_mask, randn, scheduler_timestep, text_length

FULL: dict[str, Any] = dict(num_attention_heads=16, attention_head_dim=72, in_channels=4, out_channels=8,
                            num_layers=28, cross_attention_dim=1152, attention_bias=True, sample_size=128,
                            patch_size=2, activation_fn="gelu-approximate", num_embeds_ada_norm=1000,
                            norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6,
                            interpolation_scale=2, use_additional_conditions=False, caption_channels=4096)
TINY: dict[str, Any] = dict(FULL, num_attention_heads=2, attention_head_dim=16, num_layers=1, cross_attention_dim=32,
                            sample_size=8, caption_channels=24)
# (latent height, width, T5 tokens)
SHAPES = {"full": (128, 128, 300), "tiny": (8, 8, 8)}


def build_model(size: Size) -> torch.nn.Module:
    from diffusers import PixArtTransformer2DModel

    return PixArtTransformer2DModel(**(FULL if size == "full" else TINY))


def build_inputs(size: Size, device: torch.device, dtype: torch.dtype,
                 generator: torch.Generator, negative: bool) -> dict[str, Any]:
    config = FULL if size == "full" else TINY
    height, width, text = SHAPES[size]
    t = draw_timestep(generator)
    return dict(
        hidden_states=randn((1, config["in_channels"], height, width), generator, device, dtype),
        encoder_hidden_states=randn((1, text, config["caption_channels"]), generator, device, dtype),
        encoder_attention_mask=prompt_mask(text, text_length(text, negative), device, torch.int64),
        timestep=scheduler_timestep(t, device, torch.int64),
        added_cond_kwargs={"resolution": None, "aspect_ratio": None},
        return_dict=False,
    )


WORKLOAD = Workload(
    name="pixart-sigma",
    description="PixArtTransformer2DModel, PixArt-Sigma-XL-2-1024-MS config, random weights",
    build_model=build_model,
    build_inputs=build_inputs,
    step_invariant=("timestep",),
    pipeline_timestep=unscaled,
)
