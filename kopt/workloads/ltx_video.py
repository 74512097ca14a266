"""LTX-Video 0.9: diffusers' ``LTXVideoTransformer3DModel`` with random weights (a video DiT).

Full size is the published 2B configuration (the class defaults: 28 blocks, 32 heads x 64 = 2048
wide, 128 latent channels, T5 text of 4096 channels). Inputs follow ``LTXPipeline`` at its default
704x480 and 161 frames at 25 fps: the VAE compresses 8x in time and 32x in space, so the packed
latents are (161 - 1) / 8 + 1 = 21 frames of 15 x 22 = 6,930 tokens of 128 channels; 128 T5 tokens
with the tokenizer's boolean mask; the raw scheduler timestep ``t`` (float32); the latent grid and
``rope_interpolation_scale = (8 / 25, 32, 32)`` as plain Python values. The pipeline batches the CFG
halves into one call of batch 2.
"""

from __future__ import annotations

from typing import Any

import torch

from kopt.workloads.base import Size, Workload, unscaled
from kopt.workloads.pipeline_inputs import draw_timestep, prompt_mask, randn, scheduler_timestep, text_length

FULL: dict[str, Any] = dict(in_channels=128, out_channels=128, patch_size=1, patch_size_t=1, num_attention_heads=32,
                            attention_head_dim=64, cross_attention_dim=2048, num_layers=28,
                            activation_fn="gelu-approximate", qk_norm="rms_norm_across_heads",
                            norm_elementwise_affine=False, norm_eps=1e-6, caption_channels=4096, attention_bias=True,
                            attention_out_bias=True)
TINY: dict[str, Any] = dict(FULL, in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16,
                            cross_attention_dim=32, num_layers=1, caption_channels=24)
# (latent frames, latent height, latent width, T5 tokens)
SHAPES = {"full": (21, 15, 22, 128), "tiny": (2, 3, 4, 8)}
FRAME_RATE, TEMPORAL_COMPRESSION, SPATIAL_COMPRESSION = 25, 8, 32


def build_model(size: Size) -> torch.nn.Module:
    from diffusers import LTXVideoTransformer3DModel

    return LTXVideoTransformer3DModel(**(FULL if size == "full" else TINY))


def build_inputs(size: Size, device: torch.device, dtype: torch.dtype,
                 generator: torch.Generator, negative: bool) -> dict[str, Any]:
    config = FULL if size == "full" else TINY
    frames, height, width, text = SHAPES[size]
    t = draw_timestep(generator)
    return dict(
        hidden_states=randn((1, frames * height * width, config["in_channels"]), generator, device, dtype),
        encoder_hidden_states=randn((1, text, config["caption_channels"]), generator, device, dtype),
        timestep=scheduler_timestep(t, device, torch.float32),
        encoder_attention_mask=prompt_mask(text, text_length(text, negative), device, torch.bool),
        num_frames=frames,
        height=height,
        width=width,
        rope_interpolation_scale=(TEMPORAL_COMPRESSION / FRAME_RATE, SPATIAL_COMPRESSION, SPATIAL_COMPRESSION),
        return_dict=False,
    )


WORKLOAD = Workload(
    name="ltx-video",
    description="LTXVideoTransformer3DModel, LTX-Video 0.9 2B config (video), random weights",
    build_model=build_model,
    build_inputs=build_inputs,
    step_invariant=("timestep",),
    pipeline_timestep=unscaled,
)
