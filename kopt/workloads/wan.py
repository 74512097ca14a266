"""Wan 2.1 T2V 14B: diffusers' ``WanTransformer3DModel`` with random weights (a video DiT).

Full size is the published 14B configuration (the class defaults: 40 blocks, 40 heads x 128 = 5120
wide, FFN 13824, umT5 text of 4096 channels). Inputs follow ``WanPipeline`` at its 480p default,
832x480 and 81 frames: VAE latents of 16 channels, (81 - 1) / 4 + 1 = 21 frames of 60x104, patched
1x2x2 into 21 x 30 x 52 = 32,760 tokens; 512 umT5 tokens whose padding rows the pipeline zeroes;
the raw scheduler timestep ``t`` (float32, no ``/ 1000``). RoPE is computed inside the model from
the latent shape. The pipeline runs the CFG halves as two calls.
"""

from __future__ import annotations

from typing import Any

import torch

from kopt.workloads.base import Size, Workload, unscaled
from kopt.workloads.pipeline_inputs import draw_timestep, randn, scheduler_timestep, text_length

FULL: dict[str, Any] = dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
                            out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40,
                            cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
TINY: dict[str, Any] = dict(FULL, num_attention_heads=2, attention_head_dim=24, in_channels=4, out_channels=4,
                            text_dim=32, freq_dim=32, ffn_dim=64, num_layers=1)
# (latent frames, latent height, latent width, umT5 tokens)
SHAPES = {"full": (21, 60, 104, 512), "tiny": (2, 4, 4, 8)}


def build_model(size: Size) -> torch.nn.Module:
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(**(FULL if size == "full" else TINY))


def build_inputs(size: Size, device: torch.device, dtype: torch.dtype,
                 generator: torch.Generator, negative: bool) -> dict[str, Any]:
    config = FULL if size == "full" else TINY
    frames, height, width, text = SHAPES[size]
    t = draw_timestep(generator)
    prompt = randn((1, text, config["text_dim"]), generator, device, dtype)
    prompt[:, text_length(text, negative):] = 0  # WanPipeline pads each prompt with zero rows
    return dict(
        hidden_states=randn((1, config["in_channels"], frames, height, width), generator, device, dtype),
        timestep=scheduler_timestep(t, device, torch.float32),
        encoder_hidden_states=prompt,
        return_dict=False,
    )


WORKLOAD = Workload(
    name="wan",
    description="WanTransformer3DModel, Wan2.1-T2V-14B config (video), random weights",
    build_model=build_model,
    build_inputs=build_inputs,
    step_invariant=("timestep",),
    pipeline_timestep=unscaled,
)
