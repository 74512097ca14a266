"""Stable Diffusion 3.5 Large: diffusers' ``SD3Transformer2DModel`` (MMDiT) with random weights.

Full size is the published SD3.5-Large configuration (8.1B: 38 joint blocks, 38 heads x 64 = 2432
wide, RMS QK-norm; the last block updates only the image stream). Inputs follow
``StableDiffusion3Pipeline`` at 1024x1024: 128x128 VAE latents of 16 channels (the model patches
them 2x2 into 4096 tokens), 77 CLIP + 256 T5 = 333 text tokens of 4096 channels, the pooled CLIP-L/G
embedding (2048), and the raw scheduler timestep ``t`` (float32). The pipeline batches the CFG halves
into one call of batch 2; the workload calls them separately (``Workload.cfg_pair``).
"""

from __future__ import annotations

from typing import Any

import torch

from kopt.workloads.base import Size, Workload, unscaled
from kopt.workloads.pipeline_inputs import draw_timestep, randn, scheduler_timestep

FULL: dict[str, Any] = dict(sample_size=128, patch_size=2, in_channels=16, num_layers=38, attention_head_dim=64,
                            num_attention_heads=38, joint_attention_dim=4096, caption_projection_dim=2432,
                            pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=192, qk_norm="rms_norm")
# two blocks: a joint block and the last, context_pre_only one
TINY: dict[str, Any] = dict(FULL, sample_size=8, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=16,
                            num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=32,
                            pooled_projection_dim=16, pos_embed_max_size=8)
# (latent height, width, CLIP + T5 tokens)
SHAPES = {"full": (128, 128, 77 + 256), "tiny": (8, 8, 6)}


def build_model(size: Size) -> torch.nn.Module:
    from diffusers import SD3Transformer2DModel

    return SD3Transformer2DModel(**(FULL if size == "full" else TINY))


def build_inputs(size: Size, device: torch.device, dtype: torch.dtype,
                 generator: torch.Generator, negative: bool) -> dict[str, Any]:
    config = FULL if size == "full" else TINY
    height, width, text = SHAPES[size]
    t = draw_timestep(generator)
    return dict(
        hidden_states=randn((1, config["in_channels"], height, width), generator, device, dtype),
        encoder_hidden_states=randn((1, text, config["joint_attention_dim"]), generator, device, dtype),
        pooled_projections=randn((1, config["pooled_projection_dim"]), generator, device, dtype),
        timestep=scheduler_timestep(t, device, torch.float32),
        return_dict=False,
    )


WORKLOAD = Workload(
    name="sd3",
    description="SD3Transformer2DModel, SD3.5-Large config (MMDiT), random weights",
    build_model=build_model,
    build_inputs=build_inputs,
    step_invariant=("timestep",),
    pipeline_timestep=unscaled,
)
