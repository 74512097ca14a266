"""Real diffusers pipelines assembled from tiny components built from configs, with no download.

Every component is the class the published pipeline uses (transformer, VAE, text encoders,
scheduler), with random weights and a small configuration. The tokenizers are real byte-level BPE
tokenizers (the ``tokenizers`` library, wrapped as transformers' fast tokenizers) over the 256
byte symbols plus the special tokens each pipeline's prompt template needs: every prompt
tokenizes, one token per UTF-8 byte, with nothing read from disk or a hub.
"""

from __future__ import annotations

import torch


def byte_tokenizer(special: tuple[str, ...], model_max_length: int, pad: str, eos: str | None = None):
    """A transformers fast tokenizer: byte-level BPE without merges (one token per byte) + ``special``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: index for index, symbol in enumerate(alphabet)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(special))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=model_max_length,
                                   pad_token=pad, eos_token=eos or pad, unk_token=pad)


def flow_match_scheduler():
    """FLUX.1's and Qwen-Image's scheduler configuration (resolution-dependent shift)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096,
                                           max_shift=1.15, shift=3.0, use_dynamic_shifting=True)


def tiny_flux_pipeline(seed: int = 0, guidance_embeds: bool = True):
    """``FluxPipeline``: FluxTransformer2DModel, AutoencoderKL, CLIP + T5 text encoders, flow matching."""
    from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    torch.manual_seed(seed)
    clip_tokenizer = byte_tokenizer(("<|endoftext|>",), 77, "<|endoftext|>")
    t5_tokenizer = byte_tokenizer(("<pad>", "</s>"), 512, "<pad>", eos="</s>")
    vocab = len(t5_tokenizer)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=77, projection_dim=32, eos_token_id=2)).eval()
    text_encoder_2 = T5EncoderModel(T5Config(
        vocab_size=vocab, d_model=32, d_kv=8, d_ff=37, num_layers=1, num_heads=4,
        relative_attention_num_buckets=8)).eval()
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
        guidance_embeds=guidance_embeds, axes_dims_rope=(4, 6, 6)).eval()
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), layers_per_block=1,
        latent_channels=4, norm_num_groups=4, sample_size=32, shift_factor=0.0609, scaling_factor=1.5035,
        use_quant_conv=False, use_post_quant_conv=False).eval()
    return FluxPipeline(scheduler=flow_match_scheduler(), vae=vae, text_encoder=text_encoder,
                        tokenizer=clip_tokenizer, text_encoder_2=text_encoder_2, tokenizer_2=t5_tokenizer,
                        transformer=transformer)


def tiny_qwen_image_pipeline(seed: int = 0):
    """``QwenImagePipeline``: QwenImageTransformer2DModel, AutoencoderKLQwenImage, Qwen2.5-VL text encoder."""
    from diffusers import AutoencoderKLQwenImage, QwenImagePipeline, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    tokenizer = byte_tokenizer(("<|endoftext|>", "<|im_start|>", "<|im_end|>"), 1024, "<|endoftext|>")
    text_encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=24, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 2, 2]},
                         rope_parameters={"rope_type": "default", "mrope_section": [2, 2, 2]}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=24,
                           patch_size=2, spatial_merge_size=2, temporal_patch_size=2, window_size=4,
                           fullatt_block_indexes=[0]),
        vocab_size=len(tokenizer))).eval()
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=32, num_attention_heads=2,
        joint_attention_dim=24, guidance_embeds=False, axes_dims_rope=(8, 12, 12)).eval()
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1,
                                 temperal_downsample=[False], latents_mean=[0.1, -0.2, 0.3, 0.0],
                                 latents_std=[1.5, 2.0, 1.2, 2.5]).eval()
    return QwenImagePipeline(scheduler=flow_match_scheduler(), vae=vae, text_encoder=text_encoder,
                             tokenizer=tokenizer, transformer=transformer)
