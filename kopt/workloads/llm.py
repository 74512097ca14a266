"""Three LLM families from transformers (Llama 3.1, Qwen3, Gemma 2), random weights, one prefill.

Full size is each family's published configuration (Llama-3.1-8B, Qwen3-8B, Gemma-2-9b); tiny keeps
the structure (the same config class and its features: Llama 3.1's scaled RoPE, Qwen3's QK-norm,
Gemma 2's alternating sliding-window / global layers with logit soft-capping, GeGLU and tied
embeddings) at toy widths. Inputs are what a serving engine's prefill passes: ``input_ids`` of a
realistic prompt (2048 tokens at full size; random token ids, seeded), an all-ones attention mask,
``use_cache=False`` and ``return_dict=False``, so the first output is the logits
(1, tokens, vocabulary). An LLM has no timestep: ``timestep_arg=None``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kopt.workloads.base import Size, Workload


@dataclasses.dataclass(frozen=True)
class Family:
    """One transformers model family: its config class and the published and tiny configurations."""

    name: str
    published: str
    config_class: str
    full: dict[str, Any]
    tiny: dict[str, Any]


TINY_WIDTHS = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=16, num_hidden_layers=1)
FAMILIES = (
    Family("llama", "Llama-3.1-8B", "LlamaConfig",
           full=dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_act="silu",
                     max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
                     rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                          high_freq_factor=4.0, original_max_position_embeddings=8192)),
           tiny=TINY_WIDTHS),
    Family("qwen3", "Qwen3-8B", "Qwen3Config",
           full=dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_act="silu",
                     max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False,
                     rope_parameters=dict(rope_type="default", rope_theta=1000000.0), use_sliding_window=False),
           tiny=TINY_WIDTHS),
    Family("gemma2", "Gemma-2-9b", "Gemma2Config",
           full=dict(vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256,
                     hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192, rms_norm_eps=1e-6,
                     sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                     tie_word_embeddings=True, rope_parameters=dict(rope_type="default", rope_theta=10000.0),
                     # the soft cap is computed by eager attention only; transformers versions that declare
                     # SDPA for Gemma 2 (5.17) choose it on CUDA and drop the cap
                     attn_implementation="eager"),
           # two layers: one sliding-window and one global; a window shorter than the prompt
           tiny=dict(TINY_WIDTHS, num_hidden_layers=2, query_pre_attn_scalar=16, sliding_window=8)),
)
PROMPT_TOKENS = {"full": 2048, "tiny": 16}


def _config(family: Family, size: Size) -> Any:
    import transformers

    values = family.full if size == "full" else {**family.full, **family.tiny}
    return getattr(transformers, family.config_class)(**values)


def _builder(family: Family):
    def build_model(size: Size) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_config(_config(family, size), dtype=torch.get_default_dtype())

    return build_model


def _inputs_builder(family: Family):
    def build_inputs(size: Size, device: torch.device, dtype: torch.dtype,
                     generator: torch.Generator, negative: bool) -> dict[str, Any]:
        tokens = PROMPT_TOKENS[size]
        vocab = (family.full if size == "full" else {**family.full, **family.tiny})["vocab_size"]
        return dict(
            input_ids=torch.randint(0, vocab, (1, tokens), generator=generator).to(device),
            attention_mask=torch.ones(1, tokens, dtype=torch.int64, device=device),
            use_cache=False,
            return_dict=False,
        )

    return build_inputs


def workload(family: Family) -> Workload:
    return Workload(
        name=family.name,
        description=f"{family.config_class.removesuffix('Config')}ForCausalLM, {family.published} config "
                    f"(prefill, logits), random weights",
        build_model=_builder(family),
        build_inputs=_inputs_builder(family),
        step_invariant=(),
        timestep_arg=None,
    )


WORKLOADS = tuple(workload(family) for family in FAMILIES)
