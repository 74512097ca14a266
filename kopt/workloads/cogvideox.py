"""CogVideoX-5B: diffusers' ``CogVideoXTransformer3DModel`` with random weights (a video DiT).

Full size is the published CogVideoX-5b configuration (42 blocks, 48 heads x 64 = 3072 wide, 3-D
RoPE, T5 text of 4096 channels). Inputs follow ``CogVideoXPipeline`` at its default 720x480 and 49
frames: latents laid out (batch, frames, channels, height, width), (49 - 1) / 4 + 1 = 13 frames of
16 x 60 x 90, patched 2x2 into 13 x 30 x 45 = 17,550 video tokens after 226 T5 tokens; the integer
timestep of its DPM scheduler (int64); and the (cos, sin) RoPE tables the pipeline computes with
``get_3d_rotary_pos_embed`` over the crop region of the model's base grid. The pipeline batches
the CFG halves into one call of batch 2.
"""

from __future__ import annotations

from typing import Any

import torch

from kopt.workloads.base import Size, Workload, unscaled
from kopt.workloads.pipeline_inputs import draw_timestep, randn, scheduler_timestep

FULL: dict[str, Any] = dict(num_attention_heads=48, attention_head_dim=64, in_channels=16, out_channels=16,
                            flip_sin_to_cos=True, freq_shift=0, time_embed_dim=512, text_embed_dim=4096,
                            num_layers=42, sample_width=90, sample_height=60, sample_frames=49, patch_size=2,
                            temporal_compression_ratio=4, max_text_seq_length=226, activation_fn="gelu-approximate",
                            timestep_activation_fn="silu", norm_eps=1e-5, spatial_interpolation_scale=1.875,
                            temporal_interpolation_scale=1.0, use_rotary_positional_embeddings=True,
                            use_learned_positional_embeddings=False)
TINY: dict[str, Any] = dict(FULL, num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                            time_embed_dim=16, text_embed_dim=32, num_layers=1, sample_width=8, sample_height=8,
                            sample_frames=5, max_text_seq_length=8)
# (latent frames, latent height, latent width); the text length is the model's max_text_seq_length
SHAPES = {"full": (13, 60, 90), "tiny": (2, 8, 8)}


def build_model(size: Size) -> torch.nn.Module:
    from diffusers import CogVideoXTransformer3DModel

    return CogVideoXTransformer3DModel(**(FULL if size == "full" else TINY))


def rotary_embedding(config: dict[str, Any], frames: int, height: int, width: int,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), as ``CogVideoXPipeline._prepare_rotary_positional_embeddings`` (CogVideoX 1.0)."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed
    from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid

    patch = config["patch_size"]
    grid = (height // patch, width // patch)
    crops = get_resize_crop_region_for_grid(grid, config["sample_width"] // patch, config["sample_height"] // patch)
    return get_3d_rotary_pos_embed(embed_dim=config["attention_head_dim"], crops_coords=crops, grid_size=grid,
                                   temporal_size=frames, device=device)


def build_inputs(size: Size, device: torch.device, dtype: torch.dtype,
                 generator: torch.Generator, negative: bool) -> dict[str, Any]:
    config = FULL if size == "full" else TINY
    frames, height, width = SHAPES[size]
    t = draw_timestep(generator)
    return dict(
        hidden_states=randn((1, frames, config["in_channels"], height, width), generator, device, dtype),
        encoder_hidden_states=randn((1, config["max_text_seq_length"], config["text_embed_dim"]), generator,
                                    device, dtype),
        timestep=scheduler_timestep(t, device, torch.int64),
        image_rotary_emb=rotary_embedding(config, frames, height, width, device),
        return_dict=False,
    )


WORKLOAD = Workload(
    name="cogvideox",
    description="CogVideoXTransformer3DModel, CogVideoX-5b config (video, 3-D RoPE), random weights",
    build_model=build_model,
    build_inputs=build_inputs,
    step_invariant=("timestep", "image_rotary_emb"),
    pipeline_timestep=unscaled,
)
