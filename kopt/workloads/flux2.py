"""FLUX.2: diffusers' ``Flux2Transformer2DModel`` with random weights.

Full size is the published 32.2B [dev] configuration (the class defaults); inputs follow
``Flux2Pipeline``: a 1024x1024 image is 4096 latent tokens of 128 channels with 4-axis (t, h, w, l)
position ids, 512 text tokens of 15360 channels with their ids, ``timestep / 1000`` and the
distilled guidance value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from kopt.workloads.base import Size, Workload, randn

FULL: dict[str, Any] = {}  # the class defaults are the published configuration
TINY = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=32,
            num_attention_heads=2, joint_attention_dim=24, timestep_guidance_channels=32,
            axes_dims_rope=(8, 8, 8, 8))
# (latent grid height, width, text tokens, input channels, text channels)
SHAPES = {"full": (64, 64, 512, 128, 15360), "tiny": (8, 8, 7, 16, 24)}


def build_model(size: Size) -> torch.nn.Module:
    from diffusers import Flux2Transformer2DModel

    return Flux2Transformer2DModel(**(FULL if size == "full" else TINY))


def image_ids(height: int, width: int) -> torch.Tensor:
    """(1, H*W, 4) ids: t=0, h, w, l=0, as ``Flux2Pipeline._prepare_latent_ids``."""
    zero = torch.arange(1)
    return torch.cartesian_prod(zero, torch.arange(height), torch.arange(width), zero)[None]


def text_ids(length: int) -> torch.Tensor:
    """(1, L, 4) ids: t=h=w=0, l=position, as ``Flux2Pipeline._prepare_text_ids``."""
    zero = torch.arange(1)
    return torch.cartesian_prod(zero, zero, zero, torch.arange(length))[None]


def build_inputs(size: Size, device: torch.device, dtype: torch.dtype,
                 generator: torch.Generator, negative: bool) -> dict[str, Any]:
    height, width, text, channels, text_channels = SHAPES[size]
    return dict(
        hidden_states=randn((1, height * width, channels), generator, device, dtype),
        encoder_hidden_states=randn((1, text, text_channels), generator, device, dtype),
        timestep=torch.full((1,), 0.5, device=device, dtype=dtype),
        img_ids=image_ids(height, width).to(device),
        txt_ids=text_ids(text).to(device),
        guidance=torch.full((1,), 4.0, device=device, dtype=torch.float32),
        return_dict=False,
    )


def resized(inputs: Mapping[str, Any], height: int, width: int, text: int,
            generator: torch.Generator) -> dict[str, Any]:
    """The call for a ``height`` x ``width`` latent grid and ``text`` prompt tokens, with their ids."""
    image, prompt = inputs["hidden_states"], inputs["encoder_hidden_states"]
    return dict(inputs,
                hidden_states=randn((1, height * width, image.shape[-1]), generator, image.device, image.dtype),
                encoder_hidden_states=randn((1, text, prompt.shape[-1]), generator, prompt.device, prompt.dtype),
                img_ids=image_ids(height, width).to(image.device), txt_ids=text_ids(text).to(prompt.device))


WORKLOAD = Workload(
    name="flux2",
    description="Flux2Transformer2DModel (diffusers), random weights",
    build_model=build_model,
    build_inputs=build_inputs,
    step_invariant=("timestep", "guidance", "img_ids", "txt_ids"),
    build_resized=resized,
)
