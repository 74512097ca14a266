"""Mochi 1: diffusers' ``MochiTransformer3DModel`` with random weights (a video DiT).

Full size is the published Mochi-1-preview configuration (10B, the class defaults: 48 asymmetric
dual-stream blocks, 24 heads x 128 = 3072 wide for video and 1536 for text; the last block updates
only the video stream). Inputs follow ``MochiPipeline`` at 848x480 and 84 frames (the model card's
example): 12-channel latents, (84 - 1) / 6 + 1 = 14 frames of 60x106, patched 2x2 into 14 x 30 x 53
= 22,260 tokens; 256 T5 tokens with the tokenizer's boolean mask (attention keeps only the valid
prompt tokens, found with ``nonzero``: a graph break); the raw scheduler timestep ``t`` in the
latents' dtype (the model dtype). The pipeline batches the CFG halves into one call of batch 2.
"""

from __future__ import annotations

from typing import Any

import torch

from kopt.workloads.base import Size, Workload, unscaled
from kopt.workloads.pipeline_inputs import draw_timestep, prompt_mask, randn, scheduler_timestep, text_length

FULL: dict[str, Any] = dict(patch_size=2, num_attention_heads=24, attention_head_dim=128, num_layers=48,
                            pooled_projection_dim=1536, in_channels=12, qk_norm="rms_norm", text_embed_dim=4096,
                            time_embed_dim=256, activation_fn="swiglu", max_sequence_length=256)
# two blocks: a dual-stream block and the last, video-only one
TINY: dict[str, Any] = dict(FULL, num_attention_heads=2, attention_head_dim=16, num_layers=2,
                            pooled_projection_dim=16, in_channels=4, text_embed_dim=32, time_embed_dim=16,
                            max_sequence_length=8)
# (latent frames, latent height, latent width); the text length is the model's max_sequence_length
SHAPES = {"full": (14, 60, 106), "tiny": (2, 4, 4)}


def build_model(size: Size) -> torch.nn.Module:
    from diffusers import MochiTransformer3DModel

    return MochiTransformer3DModel(**(FULL if size == "full" else TINY))


def build_inputs(size: Size, device: torch.device, dtype: torch.dtype,
                 generator: torch.Generator, negative: bool) -> dict[str, Any]:
    config = FULL if size == "full" else TINY
    frames, height, width = SHAPES[size]
    text = config["max_sequence_length"]
    t = draw_timestep(generator)
    return dict(
        hidden_states=randn((1, config["in_channels"], frames, height, width), generator, device, dtype),
        encoder_hidden_states=randn((1, text, config["text_embed_dim"]), generator, device, dtype),
        timestep=scheduler_timestep(t, device, torch.float32).to(dtype),
        encoder_attention_mask=prompt_mask(text, text_length(text, negative), device, torch.bool),
        return_dict=False,
    )


WORKLOAD = Workload(
    name="mochi",
    description="MochiTransformer3DModel, Mochi-1-preview config (video), random weights",
    build_model=build_model,
    build_inputs=build_inputs,
    step_invariant=("timestep",),
    pipeline_timestep=unscaled,
)
