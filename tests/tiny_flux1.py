"""A tiny FLUX.1 transformer (diffusers' ``FluxTransformer2DModel`` with guidance embeddings), built
directly from its class with random weights, and inputs as the FLUX pipeline builds them.

Used by the tests of the reference, the lowering check and the precision hazards, and through
``module:factory`` by ``kopt explain tests.tiny_flux1:workload`` and ``benchmarks/dit/dit.py --models``.
"""

from __future__ import annotations

from typing import Any

import torch

from kopt.workloads import Workload
from kopt.workloads.base import Size, randn

CONFIG = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
              num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 6, 6))
HEIGHT, WIDTH, TEXT = 4, 4, 5


def build_model(size: Size = "tiny", guidance_embeds: bool = True) -> torch.nn.Module:
    from diffusers import FluxTransformer2DModel

    if size != "tiny":
        raise ValueError("tests.tiny_flux1 has only the tiny size")
    return FluxTransformer2DModel(**CONFIG, guidance_embeds=guidance_embeds)


def build_inputs(size: Size, device: torch.device, dtype: torch.dtype, generator: torch.Generator,
                 negative: bool, guidance: float | None = 3.5) -> dict[str, Any]:
    """Latents, text, pooled text, ``t / 1000`` in the model dtype, ids, and guidance in float32."""
    image_ids = torch.cartesian_prod(torch.zeros(1), torch.arange(HEIGHT).float(), torch.arange(WIDTH).float())
    inputs = dict(
        hidden_states=randn((1, HEIGHT * WIDTH, 16), generator, device, dtype),
        encoder_hidden_states=randn((1, TEXT, 32), generator, device, dtype),
        pooled_projections=randn((1, 32), generator, device, dtype),
        timestep=torch.full((1,), 0.5, device=device, dtype=dtype),
        img_ids=image_ids.to(device), txt_ids=torch.zeros(TEXT, 3, device=device),
        return_dict=False,
    )
    if guidance is not None:
        inputs["guidance"] = torch.full((1,), guidance, device=device, dtype=torch.float32)
    return inputs


def workload() -> Workload:
    """FLUX.1-dev's structure at tiny width, guidance 3.5 (3500 rounds to 3504 in bf16)."""
    return Workload(name="tiny-flux1", description="FluxTransformer2DModel(guidance_embeds=True), tiny, random",
                    build_model=build_model, build_inputs=build_inputs,
                    step_invariant=("timestep", "guidance", "img_ids", "txt_ids"))


def model_and_inputs(dtype: torch.dtype = torch.bfloat16, *, guidance: float | None = 3.5,
                     seed: int = 1) -> tuple[torch.nn.Module, dict[str, Any]]:
    """(model with weights from seed 0, inputs from ``seed``); ``guidance=None``: no guidance embedding."""
    torch.manual_seed(0)
    model = build_model(guidance_embeds=guidance is not None).to(dtype).eval().requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    return model, build_inputs("tiny", torch.device("cpu"), dtype, generator, False, guidance)
