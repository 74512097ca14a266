"""FLUX.1-dev: diffusers' ``FluxTransformer2DModel`` with guidance embedding, random weights.

Full size is the published FLUX.1-dev configuration (12B: 19 double-stream + 38 single-stream
blocks, 24 heads x 128 = 3072 wide). Inputs follow ``FluxPipeline`` at 1024x1024: 128x128 VAE
latents of 16 channels packed 2x2 into 4096 tokens of 64 channels with (0, h, w) ids, 512 T5 tokens
of 4096 channels with zero ids, the pooled CLIP embedding (768), ``timestep / 1000`` in the latents'
dtype, and ``guidance = 3.5`` as a float32 tensor. The model computes ``guidance.to(dtype) * 1000``:
in bf16 3500 rounds to 3504 before the sinusoidal embedding (issue 16's precision hazard), which
this workload reproduces because it passes guidance exactly as the pipeline does.
"""

from __future__ import annotations

from typing import Any

import torch

from kopt.workloads.base import Size, Workload
from kopt.workloads.pipeline_inputs import draw_timestep, randn, scheduler_timestep

FULL = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
            axes_dims_rope=(16, 56, 56))
TINY = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=True,
            axes_dims_rope=(4, 6, 6))
# (packed latent grid height, width, T5 tokens); full: 4096 image + 512 text tokens
SHAPES = {"full": (64, 64, 512), "tiny": (4, 4, 8)}
GUIDANCE = 3.5  # FluxPipeline's default guidance_scale


def build_model(size: Size) -> torch.nn.Module:
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel(**(FULL if size == "full" else TINY))


def image_ids(height: int, width: int) -> torch.Tensor:
    """(H*W, 3) ids (0, h, w), as ``FluxPipeline._prepare_latent_image_ids`` (float)."""
    ids = torch.zeros(height, width, 3)
    ids[..., 1] += torch.arange(height)[:, None]
    ids[..., 2] += torch.arange(width)[None, :]
    return ids.reshape(height * width, 3)


def build_inputs(size: Size, device: torch.device, dtype: torch.dtype,
                 generator: torch.Generator, negative: bool) -> dict[str, Any]:
    config = FULL if size == "full" else TINY
    height, width, text = SHAPES[size]
    t = draw_timestep(generator)
    return dict(
        hidden_states=randn((1, height * width, config["in_channels"]), generator, device, dtype),
        encoder_hidden_states=randn((1, text, config["joint_attention_dim"]), generator, device, dtype),
        pooled_projections=randn((1, config["pooled_projection_dim"]), generator, device, dtype),
        timestep=scheduler_timestep(t, device, torch.float32).to(dtype) / 1000,
        img_ids=image_ids(height, width).to(device=device, dtype=dtype),
        txt_ids=torch.zeros(text, 3, device=device, dtype=dtype),
        guidance=torch.full((1,), GUIDANCE, device=device, dtype=torch.float32),
        return_dict=False,
    )


WORKLOAD = Workload(
    name="flux1",
    description="FluxTransformer2DModel, FLUX.1-dev config (guidance-distilled), random weights",
    build_model=build_model,
    build_inputs=build_inputs,
    step_invariant=("timestep", "guidance", "img_ids", "txt_ids"),
)
