"""HiDream-I1-Full: diffusers' ``HiDreamImageTransformer2DModel`` with random weights.

Full size is the published 17B configuration (16 double-stream + 32 single-stream blocks, 20 heads
x 128 = 2560 wide, a mixture of 4 routed experts (2 active) plus a shared one in every feed-forward,
each block reading one layer of the Llama-3.1-8B text encoder). Inputs follow
``HiDreamImagePipeline`` at 1024x1024: 128x128 latents of 16 channels (patched 2x2 into 4096 tokens
inside the model), 128 T5 tokens of 4096 channels, all 32 Llama hidden states stacked
(32, batch, 128, 4096), the pooled CLIP-L + CLIP-G embedding (2048), and the raw scheduler timestep
``t`` (float32, argument ``timesteps``). The experts are dispatched on the host (``bincount().cpu()``),
so the forward breaks into several graphs whose shapes depend on the routing. The pipeline batches
the CFG halves into one call of batch 2.
"""

from __future__ import annotations

from typing import Any

import torch

from kopt.workloads.base import Size, Workload, unscaled
from kopt.workloads.pipeline_inputs import draw_timestep, randn, scheduler_timestep

FULL: dict[str, Any] = dict(patch_size=2, in_channels=16, out_channels=16, num_layers=16, num_single_layers=32,
                            attention_head_dim=128, num_attention_heads=20, caption_channels=[4096, 4096],
                            text_emb_dim=2048, num_routed_experts=4, num_activated_experts=2,
                            axes_dims_rope=(64, 32, 32), max_resolution=(128, 128),
                            llama_layers=list(range(32)) + [31] * 16)
TINY: dict[str, Any] = dict(FULL, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1,
                            attention_head_dim=16, num_attention_heads=2, caption_channels=[32, 32], text_emb_dim=16,
                            axes_dims_rope=(8, 4, 4), max_resolution=(8, 8), llama_layers=[0, 1])
# (latent height, width, T5 tokens, Llama tokens, Llama layers stacked)
SHAPES = {"full": (128, 128, 128, 128, 32), "tiny": (8, 8, 6, 6, 2)}


def build_model(size: Size) -> torch.nn.Module:
    from diffusers import HiDreamImageTransformer2DModel

    return HiDreamImageTransformer2DModel(**(FULL if size == "full" else TINY))


def build_inputs(size: Size, device: torch.device, dtype: torch.dtype,
                 generator: torch.Generator, negative: bool) -> dict[str, Any]:
    config = FULL if size == "full" else TINY
    height, width, t5_tokens, llama_tokens, llama_layers = SHAPES[size]
    t5_channels, llama_channels = config["caption_channels"]
    t = draw_timestep(generator)
    return dict(
        hidden_states=randn((1, config["in_channels"], height, width), generator, device, dtype),
        timesteps=scheduler_timestep(t, device, torch.float32),
        encoder_hidden_states_t5=randn((1, t5_tokens, t5_channels), generator, device, dtype),
        encoder_hidden_states_llama3=randn((llama_layers, 1, llama_tokens, llama_channels), generator, device, dtype),
        pooled_embeds=randn((1, config["text_emb_dim"]), generator, device, dtype),
        return_dict=False,
    )


WORKLOAD = Workload(
    name="hidream",
    description="HiDreamImageTransformer2DModel, HiDream-I1-Full config (MoE), random weights",
    build_model=build_model,
    build_inputs=build_inputs,
    step_invariant=("timesteps",),
    timestep_arg="timesteps",
    pipeline_timestep=unscaled,
)
