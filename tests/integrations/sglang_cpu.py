"""Running SGLang's own DiT classes on a CPU without its GPU extras, for kopt's SGLang tests.

SGLang 0.5.23 builds its DiTs from its own layers, whose CPU forward calls the AMX build of
``sgl_kernel`` (not on PyPI). Three accommodations, each the smallest that runs SGLang's code as is:

- the CPU op those layers call, ``sgl_kernel::fused_scale_shift_cpu``, is registered here with
  SGLang's own PyTorch implementation of it (``fuse_scale_shift_kernel_native``, which SGLang uses
  on MPS and MUSA), so the op is in the graph exactly as on a CPU server;
- modules are constructed while SGLang's platform reports "not a CPU", so ``CustomOp`` layers bind
  SGLang's ``forward_native`` (their PyTorch path) instead of ``forward_cpu`` (the AMX kernels);
- one process is its own distributed group, and the global server args are SGLang's unit-test ones
  (``sglang.multimodal_gen.test.unit.conftest``, shipped in the wheel).
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
import unittest.mock
from collections.abc import Iterator
from types import SimpleNamespace

import torch

_LIBRARY: list[torch.library.Library] = []


def start_runtime() -> None:
    """Single-process distributed state, SGLang's unit-test server args, the CPU scale-shift op."""
    for key, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29631", RANK="0", WORLD_SIZE="1",
                           LOCAL_RANK="0").items():
        os.environ.setdefault(key, value)
    from sglang.multimodal_gen.runtime.distributed.parallel_state import (
        maybe_init_distributed_environment_and_model_parallel,
    )
    from sglang.multimodal_gen.runtime.server_args import set_global_server_args
    from sglang.multimodal_gen.test.unit.conftest import _make_unit_server_args

    maybe_init_distributed_environment_and_model_parallel(tp_size=1, sp_size=1)
    set_global_server_args(_make_unit_server_args())
    if not _LIBRARY and not hasattr(torch.ops.sgl_kernel, "fused_scale_shift_cpu"):
        from sglang.kernels.ops.diffusion.common.fallback_torch import fuse_scale_shift_kernel_native

        sys.modules.setdefault("sgl_kernel", types.ModuleType("sgl_kernel"))  # SGLang imports it first
        library = torch.library.Library("sgl_kernel", "FRAGMENT")
        library.define("fused_scale_shift_cpu(Tensor x, Tensor scale, Tensor shift, float scale_constant) -> Tensor")
        library.impl("fused_scale_shift_cpu",
                     lambda x, scale, shift, constant: fuse_scale_shift_kernel_native(x, scale, shift, constant), "CPU")
        torch.library.register_fake("sgl_kernel::fused_scale_shift_cpu",
                                    lambda x, scale, shift, constant: torch.empty_like(x), lib=library)
        _LIBRARY.append(library)


@contextlib.contextmanager
def native_layers() -> Iterator[None]:
    """While active, SGLang's CustomOp layers built bind ``forward_native``."""
    from sglang.multimodal_gen.runtime.platforms import current_platform

    with unittest.mock.patch.object(type(current_platform), "is_cpu", lambda self: False):
        yield


def tiny_qwen_image(seed: int = 0) -> torch.nn.Module:
    """SGLang's ``QwenImageTransformer2DModel``: 2 blocks, 2 heads of 32, random weights."""
    from sglang.multimodal_gen.configs.models.dits.qwenimage import QwenImageDitConfig
    from sglang.multimodal_gen.runtime.models.dits.qwen_image import QwenImageTransformer2DModel

    config = QwenImageDitConfig()
    for key, value in dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=32,
                           num_attention_heads=2, joint_attention_dim=24, guidance_embeds=False,
                           axes_dims_rope=(8, 12, 12)).items():
        setattr(config.arch_config, key, value)
    with native_layers():
        model = QwenImageTransformer2DModel(config=config, hf_config={})
    return randomized(model, seed)


def randomized(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random weights: SGLang allocates parameters for a checkpoint to fill (``torch.empty``), so a model
    built without loading one holds whatever memory it got. Normal(0, 0.05), ones for norm scales."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if parameter.dim() == 1 and "norm" in name and name.endswith("weight"):
                parameter.fill_(1.0)
            else:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    if hasattr(model, "post_load_weights"):
        model.post_load_weights()
    return model.eval()


def qwen_image_inputs(seed: int, timestep: float = 500.0, text: int = 7) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return dict(hidden_states=torch.randn(1, 64, 16, generator=generator),
                encoder_hidden_states=torch.randn(1, text, 24, generator=generator),
                encoder_hidden_states_mask=None, timestep=torch.tensor([timestep]), img_shapes=[[(1, 8, 8)]],
                txt_seq_lens=[text], return_dict=False)


def tiny_flux2(seed: int = 0) -> torch.nn.Module:
    """SGLang's ``Flux2Transformer2DModel``: 1 double + 1 single block, 2 heads of 32, random weights."""
    from sglang.multimodal_gen.configs.models.dits.flux import FluxConfig
    from sglang.multimodal_gen.runtime.models.dits.flux_2 import Flux2Transformer2DModel

    config = FluxConfig()
    for key, value in dict(patch_size=1, in_channels=16, out_channels=None, num_layers=1, num_single_layers=1,
                           attention_head_dim=32, num_attention_heads=2, joint_attention_dim=24,
                           timestep_guidance_channels=32, mlp_ratio=3.0, axes_dims_rope=(8, 8, 8, 8), rope_theta=2000,
                           eps=1e-6, guidance_embeds=True).items():
        setattr(config.arch_config, key, value)
    with native_layers():
        model = Flux2Transformer2DModel(config=config, hf_config={})
    return randomized(model, seed)


def flux2_inputs(model: torch.nn.Module, seed: int, timestep: float = 0.5) -> dict:
    """Packed 8x8 latents, 7 text tokens, and the RoPE tables SGLang's FLUX.2 pipeline config builds
    (``get_freqs_cis``: the model's rotary embedding of text ids, then image ids)."""
    from sglang.multimodal_gen.configs.pipeline_configs.flux import _prepare_latent_ids, _prepare_text_ids

    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(1, 16, 8, 8, generator=generator)
    text = torch.randn(1, 7, 24, generator=generator)
    image_cos, image_sin = model.rotary_emb.forward(_prepare_latent_ids(latents)[0])
    text_cos, text_sin = model.rotary_emb.forward(_prepare_text_ids(text)[0])
    return dict(hidden_states=latents.flatten(2).transpose(1, 2), encoder_hidden_states=text,
                timestep=torch.tensor([timestep]), guidance=torch.tensor([4.0]),
                freqs_cis=(torch.cat([text_cos, image_cos]), torch.cat([text_sin, image_sin])))


def widened(inputs: dict) -> dict:
    """``inputs`` with every floating tensor (also inside tuples) in float64."""
    def cast(value: object) -> object:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.double()
        if isinstance(value, tuple):
            return tuple(cast(v) for v in value)
        return value

    return {key: cast(value) for key, value in inputs.items()}


def denoising_stage(enable_torch_compile: bool = True):
    """A real ``DenoisingStage`` object (made as SGLang's own unit tests make one) whose unmodified
    ``_maybe_torch_compile`` compiles a module as SGLang's pipeline does."""
    from sglang.multimodal_gen.runtime.pipelines_core.stages.denoising import DenoisingStage
    from sglang.multimodal_gen.runtime.utils.torch_compile import CompiledModuleRegistry

    stage = DenoisingStage.__new__(DenoisingStage)
    stage.server_args = SimpleNamespace(enable_torch_compile=enable_torch_compile, enable_breakable_cuda_graph=False,
                                        regional_compile=False, pipeline_config=SimpleNamespace(dit_config=None))
    stage._cache_dit_enabled = False
    stage._torch_compile_registry = CompiledModuleRegistry()
    return stage


def forward(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    from sglang.multimodal_gen.runtime.managers.forward_context import set_forward_context

    with torch.no_grad(), set_forward_context(current_timestep=0, attn_metadata=None):
        out = model(**inputs)
    return out[0] if isinstance(out, (tuple, list)) else out
