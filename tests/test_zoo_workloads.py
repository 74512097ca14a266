"""The zoo's workloads: published configurations, tiny ones of the same structure, pipeline-faithful inputs.

No compilation here (``tests/test_zoo.py`` compiles); full sizes are built on the meta device.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from benchmarks.dit.variants import compile_regions
from kopt.workloads import BUILTIN, DIFFUSERS, LLMS, get_workload

# published parameter counts (billions) of the full configurations
PUBLISHED_BILLIONS = {
    "qwen-image": 20.4, "flux2": 32.2, "flux1": 11.9, "wan": 14.3, "sd3": 8.1, "cogvideox": 5.6, "ltx-video": 1.9,
    "hunyuan-video": 12.8, "sana": 1.6, "lumina2": 2.6, "pixart-sigma": 0.61, "chroma": 8.9, "hidream": 17.1,
    "mochi": 10.0, "llama": 8.0, "qwen3": 8.2, "gemma2": 9.2,
}
# the main input's shape at full size (the published resolution; tokens in the docstrings)
FULL_INPUT = {
    "flux1": ("hidden_states", (1, 4096, 64)), "wan": ("hidden_states", (1, 16, 21, 60, 104)),
    "sd3": ("hidden_states", (1, 16, 128, 128)), "cogvideox": ("hidden_states", (1, 13, 16, 60, 90)),
    "ltx-video": ("hidden_states", (1, 6930, 128)), "hunyuan-video": ("hidden_states", (1, 16, 33, 90, 160)),
    "sana": ("hidden_states", (1, 32, 32, 32)), "lumina2": ("hidden_states", (1, 16, 128, 128)),
    "pixart-sigma": ("hidden_states", (1, 4, 128, 128)), "chroma": ("hidden_states", (1, 4096, 64)),
    "hidream": ("encoder_hidden_states_llama3", (32, 1, 128, 4096)), "mochi": ("hidden_states", (1, 12, 14, 60, 106)),
    "llama": ("input_ids", (1, 2048)), "qwen3": ("input_ids", (1, 2048)), "gemma2": ("input_ids", (1, 2048)),
}


def structure(model: nn.Module) -> set[tuple[str, tuple[str, ...]]]:
    """Each module's class and its children's names (containers of numbered blocks left out): the
    block types and their layout, whatever the widths and depths."""
    return {(type(m).__name__, tuple(name for name, _ in m.named_children())) for m in model.modules()
            if not isinstance(m, (nn.ModuleList, nn.Sequential))}


def test_the_zoo_has_ten_diffusers_transformers_and_three_llm_families():
    assert len(DIFFUSERS) >= 10 and len(LLMS) >= 3
    assert {"flux1", "wan"} <= set(BUILTIN)


@pytest.mark.parametrize("name", list(BUILTIN))
def test_full_size_is_the_published_model_and_tiny_keeps_its_structure(name):
    """On the meta device the full configuration has the published parameter count; the tiny model
    has the same module types, each with the same children."""
    workload = get_workload(name)
    full = workload.model("full", device="meta", dtype=torch.bfloat16)
    billions = sum(p.numel() for p in full.parameters()) / 1e9
    assert billions == pytest.approx(PUBLISHED_BILLIONS[name], rel=0.03)
    assert structure(workload.model("tiny")) == structure(full)


@pytest.mark.parametrize("name", sorted(FULL_INPUT))
def test_full_size_inputs_have_the_published_resolution(name):
    argument, shape = FULL_INPUT[name]
    inputs = get_workload(name).inputs("full", device="meta", dtype=torch.bfloat16)
    assert tuple(inputs[argument].shape) == shape


@pytest.mark.parametrize("name", list(BUILTIN))
def test_tiny_runs_and_inputs_are_fresh_and_seeded(name):
    """One eager call gives a finite first output; the same seed gives the same inputs, another seed
    different ones (never all zeros)."""
    workload = get_workload(name)
    torch.manual_seed(0)
    model = workload.model("tiny")
    first, again, other = (workload.inputs("tiny", seed=s) for s in (3, 3, 4))
    with torch.no_grad():
        output = model(**first)[0]
    assert torch.isfinite(output).all() and output.abs().sum() > 0
    tensors = [(k, v) for k, v in first.items() if isinstance(v, torch.Tensor)]
    assert all(torch.equal(v, again[k]) for k, v in tensors)
    assert any(not torch.equal(v, other[k]) for k, v in tensors if v.numel() >= 16)


def test_flux1_passes_guidance_as_the_pipeline_does():
    """FluxPipeline: guidance 3.5 in float32, timestep / 1000 in the model dtype; the model's
    ``guidance.to(bf16) * 1000`` then rounds 3500 to 3504 (issue 16's hazard, reproduced)."""
    inputs = get_workload("flux1").inputs("tiny", dtype=torch.bfloat16, seed=0)
    assert inputs["guidance"].dtype == torch.float32 and inputs["guidance"].item() == 3.5
    assert (inputs["guidance"].to(torch.bfloat16) * 1000).item() == 3504
    assert inputs["timestep"].dtype == torch.bfloat16 and 0.1 <= inputs["timestep"].item() < 1.0


@pytest.mark.parametrize(("name", "dtype", "low", "high"), [
    ("wan", torch.float32, 100, 1000), ("sd3", torch.float32, 100, 1000), ("cogvideox", torch.int64, 100, 1000),
    ("pixart-sigma", torch.int64, 100, 1000), ("lumina2", torch.float32, 0.0, 0.9), ("chroma", torch.bfloat16, 0.1, 1),
])
def test_each_pipeline_timestep_convention(name, dtype, low, high):
    """Raw t (Wan, SD3), integer t of a DPM/DDIM scheduler (CogVideoX, PixArt), 1 - t/1000 (Lumina2),
    t/1000 in the latents' dtype (Chroma)."""
    workload = get_workload(name)
    timestep = workload.inputs("tiny", dtype=torch.bfloat16, seed=5)[workload.timestep_arg]
    assert timestep.dtype == dtype and low <= timestep.item() <= high


def test_integer_timesteps_stay_integers_across_steps_and_cfg_pairs():
    workload = get_workload("cogvideox")
    inputs = workload.inputs("tiny", seed=0)
    stepped = workload.at_step(inputs, 7)["timestep"]
    assert stepped.dtype == torch.int64 and stepped.item() == round(inputs["timestep"].item() * 0.93)
    seen = []
    workload.cfg_pair(lambda **kw: seen.append(kw["timestep"]), inputs, inputs, t=250.0)
    assert seen[0].dtype == torch.int64 and seen[0].item() == 250 and seen[0] is not seen[1]


def test_llm_workloads_have_no_timestep_and_return_logits():
    for workload in LLMS:
        assert workload.timestep_arg is None and workload.step_invariant == ()
        inputs = workload.inputs("tiny", seed=0)
        assert inputs["use_cache"] is False and workload.at_step(inputs, 3) == inputs
        torch.manual_seed(0)
        logits = workload.model("tiny")(**inputs)[0]
        assert logits.shape == (*inputs["input_ids"].shape, workload.model("tiny").config.vocab_size)


def test_gemma2_runs_its_soft_capped_attention_whatever_transformers_defaults_to(monkeypatch):
    """Gemma 2's attention logits are soft-capped, which only transformers' eager attention computes.
    Versions that declare SDPA support for Gemma 2 (5.17, on the GPU machine) pick SDPA by default on
    CUDA and drop the cap; the workload names eager attention so every version builds the published
    computation."""
    import transformers
    from transformers.models.gemma2 import modeling_gemma2

    from kopt.workloads.llm import FAMILIES

    monkeypatch.setattr(modeling_gemma2.Gemma2PreTrainedModel, "_supports_sdpa", True)
    assert get_workload("gemma2").model("tiny").config._attn_implementation == "eager"
    published = next(f for f in FAMILIES if f.name == "gemma2").full  # what the full-size model is built from
    assert transformers.Gemma2Config(**published)._attn_implementation == "eager"


@pytest.mark.parametrize(("name", "block"), [("sd3", "JointTransformerBlock"), ("llama", "LlamaDecoderLayer"),
                                             ("flux1", "FluxTransformerBlock")])
def test_regional_compile_finds_the_blocks_without_repeated_blocks(name, block):
    """benchmarks' regional torch.compile: diffusers' _repeated_blocks where declared, else the
    items of the outermost ModuleLists (SD3, LLMs); compiling is lazy, so nothing is lowered here."""
    model = get_workload(name).model("tiny")
    notes = compile_regions(model)
    compiled = {type(m).__name__ for m in model.modules() if getattr(m, "_compiled_call_impl", None) is not None}
    assert block in compiled and block in notes
