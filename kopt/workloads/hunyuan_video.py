"""HunyuanVideo: diffusers' ``HunyuanVideoTransformer3DModel`` with random weights (a video DiT).

Full size is the published 13B configuration (the class defaults: 20 double-stream + 40
single-stream blocks, 24 heads x 128 = 3072 wide, a 2-block token refiner, guidance embedding).
Inputs follow ``HunyuanVideoPipeline`` at its default 1280x720 and 129 frames: latents of 16
channels, (129 - 1) / 4 + 1 = 33 frames of 90x160, patched 1x2x2 into 33 x 45 x 80 = 118,800
tokens (attention is ~3/4 of the FLOPs: one forward is tens of seconds even on an H200); 256
Llama tokens of 4096 channels with their mask in the model dtype; the pooled CLIP embedding (768);
the raw scheduler timestep ``t`` (float32); and ``guidance`` built as the pipeline builds it,
``tensor([6.0], dtype=model dtype) * 1000`` (rounded to 6016 in bf16 before the model sees it).
"""

from __future__ import annotations

from typing import Any

import torch

from kopt.workloads.base import Size, Workload, unscaled
from kopt.workloads.pipeline_inputs import draw_timestep, prompt_mask, randn, scheduler_timestep, text_length

FULL: dict[str, Any] = dict(in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128,
                            num_layers=20, num_single_layers=40, num_refiner_layers=2, mlp_ratio=4.0, patch_size=2,
                            patch_size_t=1, qk_norm="rms_norm", guidance_embeds=True, text_embed_dim=4096,
                            pooled_projection_dim=768, rope_theta=256.0, rope_axes_dim=(16, 56, 56))
TINY: dict[str, Any] = dict(FULL, in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16,
                            num_layers=1, num_single_layers=1, num_refiner_layers=1, text_embed_dim=32,
                            pooled_projection_dim=16, rope_axes_dim=(4, 6, 6))
# (latent frames, latent height, latent width, Llama tokens)
SHAPES = {"full": (33, 90, 160, 256), "tiny": (2, 4, 4, 8)}
GUIDANCE = 6.0  # HunyuanVideoPipeline's default guidance_scale


def build_model(size: Size) -> torch.nn.Module:
    from diffusers import HunyuanVideoTransformer3DModel

    return HunyuanVideoTransformer3DModel(**(FULL if size == "full" else TINY))


def build_inputs(size: Size, device: torch.device, dtype: torch.dtype,
                 generator: torch.Generator, negative: bool) -> dict[str, Any]:
    config = FULL if size == "full" else TINY
    frames, height, width, text = SHAPES[size]
    t = draw_timestep(generator)
    return dict(
        hidden_states=randn((1, config["in_channels"], frames, height, width), generator, device, dtype),
        timestep=scheduler_timestep(t, device, torch.float32),
        encoder_hidden_states=randn((1, text, config["text_embed_dim"]), generator, device, dtype),
        encoder_attention_mask=prompt_mask(text, text_length(text, negative), device, dtype),
        pooled_projections=randn((1, config["pooled_projection_dim"]), generator, device, dtype),
        guidance=torch.tensor([GUIDANCE], device=device, dtype=dtype) * 1000.0,
        return_dict=False,
    )


WORKLOAD = Workload(
    name="hunyuan-video",
    description="HunyuanVideoTransformer3DModel, HunyuanVideo 13B config (video), random weights",
    build_model=build_model,
    build_inputs=build_inputs,
    step_invariant=("timestep", "guidance"),
    pipeline_timestep=unscaled,
)
